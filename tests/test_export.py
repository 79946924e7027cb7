"""jaxemb.export: the exported sentence-transformers models give the vectors `Encoder.encode` gives; their model
cards; the command and its upload."""

import argparse
import json
import math
import pathlib
import shutil

import numpy as np
import pytest

from jaxemb import export, model_card, storage
from jaxemb.encode import Encoder, Method
from jaxemb.errors import StorageError
from jaxemb.methods.prompt import PROMPT_MODULE
from jaxemb.testing.checkpoints import write_random_checkpoint
from tests.support import assert_float32_close, float32_atol, transformer_roundings, vector_scale

SENTENCES = [
  "a man is playing a guitar .",
  "  A woman slices an onion!  ",
  "hello",
  "the quick brown fox jumps over the lazy dog , twice , before breakfast on a cold morning .",
  " ".join(["word", "play"] * 100),  # Past the tiny models' 128 positions: both cut its end, the template kept whole.
]
TEMPLATES = {"bert": 'This sentence : "[X]" means [MASK] .', "roberta": "This sentence : ' [X] ' means [MASK] ."}


@pytest.fixture(scope="module")
def with_pooler(tmp_path_factory):
  """Tiny random `*Model` checkpoints, which keep the pooler that `cls` and head "pooler" read."""
  return {
    family: write_random_checkpoint(tmp_path_factory.mktemp(f"pooler-{family}"), family, head=False)
    for family in ("bert", "roberta")
  }


@pytest.fixture(scope="module")
def electra(tmp_path_factory):
  """A tiny ELECTRA discriminator whose word embeddings (16 wide) are projected to its 32-wide layers: Ditto's
  static variant sums the raw rows, its first-last the projected ones."""
  return write_random_checkpoint(tmp_path_factory.mktemp("electra"), "electra", head=False, embedding_size=16)


@pytest.fixture(scope="module")
def with_mlm(tmp_path_factory, tiny_bert):
  """Tiny random `*ForMaskedLM` checkpoints, which hold the MLM transform of head "mlm_transform"."""
  return {"bert": tiny_bert, "roberta": write_random_checkpoint(tmp_path_factory.mktemp("mlm-roberta"), "roberta")}


def _assert_exported(theirs, encoder, ours, extra: int = 0):
  """sentence-transformers' vectors (torch, float32) equal jaxemb's within float32's rounding of the forward, its
  pooling and head, and `extra` roundings after them, on the vectors' scale (tests/support.py)."""
  head = getattr(encoder.method, "head", "none") == "mlm_transform"
  roundings = transformer_roundings(encoder.config, mlm_head=head, extra=1 + extra)  # 1: a denoised difference.
  assert_float32_close(theirs, ours, roundings, scale=vector_scale(encoder, ours))


def _sentence_transformers(out):
  sentence_transformers = pytest.importorskip("sentence_transformers")
  # trust_remote_code: the prompt methods' custom module; the stock modules ignore it.
  return sentence_transformers.SentenceTransformer(str(out), device="cpu", trust_remote_code=True)


def _sentence_transformers_encode(out):
  return _sentence_transformers(out).encode


@pytest.mark.parametrize(
  "family, name", [("bert", "last_avg"), ("bert", "cls"), ("roberta", "last_avg"), ("roberta", "cls_before_pooler")]
)
def test_sentence_transformers_vectors_equal_jaxemb(with_pooler, tmp_path, family, name):
  out = export.export_model(with_pooler[family], tmp_path / "st", name)
  encoder = Encoder.from_pretrained(with_pooler[family], name)
  ours = encoder.encode(SENTENCES)
  # sentence-transformers does not strip sentences as jaxemb does (RoBERTa's BPE would see the spaces).
  theirs = _sentence_transformers_encode(out)([s.strip() for s in SENTENCES])
  _assert_exported(theirs, encoder, ours)


# RoBERTa's '[X]' (no space inside the quotes): "onion." merges with the closing quote into one token (`.'`) in the
# filled-in template, so jaxemb and the module tokenise that sentence alone.
@pytest.mark.parametrize(
  "family, fields",
  [
    ("bert", dict(template=TEMPLATES["bert"])),
    ("roberta", dict(template=TEMPLATES["roberta"])),
    ("bert", dict(template=TEMPLATES["bert"], denoise="position_offset", head="mlm_transform")),
    ("roberta", dict(template=TEMPLATES["roberta"], denoise="position_offset", head="pooler")),
    ("roberta", dict(template="This sentence : '[X]' means [MASK] .", denoise="position_offset", head="mlm_transform")),
    (
      "bert",
      dict(template='This sentence of "[X]" means [MASK] , so [MASK] .', denoise="position_offset", head="pooler"),
    ),
    (
      "roberta",
      dict(template=TEMPLATES["roberta"], denoise="position_offset", tokenization="alone", bias_positions="model"),
    ),
  ],
  ids=lambda value: value if isinstance(value, str) else "-".join(map(str, value.values())),
)
def test_prompt_sentence_transformers_module_equals_jaxemb(with_pooler, with_mlm, tmp_path, family, fields):
  """The custom module (trust_remote_code) gives Encoder.encode's vectors for each template, denoising, head and
  tokenization, with the sentences as they are (it strips them as jaxemb does in context)."""
  method = Method("prompt", **fields)
  source = (with_mlm if method.head == "mlm_transform" else with_pooler)[family]  # An MLM checkpoint has no pooler.
  out = export.export_model(source, tmp_path / "prompt", method)
  sentences = [*SENTENCES, "A woman slices an onion."]
  encoder = Encoder.from_pretrained(source, method)
  ours = encoder.encode(sentences)
  model = _sentence_transformers(out)
  _assert_exported(model.encode(sentences), encoder, ours)


@pytest.mark.parametrize(
  "family, fields",
  [
    ("bert", dict(layer=1, head=2, variant="first_last")),
    ("roberta", dict(layer=0, head=3, variant="last")),
    ("bert", dict(layer=2, head=0, variant="static")),
    ("roberta", dict(layer=1, head=1, variant="embedding_output", tokenization="alone")),
    ("electra", dict(layer=0, head=1, variant="first_last")),
    ("electra", dict(layer=1, head=3, variant="static")),
  ],
  ids=lambda value: value if isinstance(value, str) else "-".join(map(str, value.values())),
)
def test_ditto_sentence_transformers_module_equals_jaxemb(with_pooler, electra, tmp_path, family, fields):
  """The custom module (trust_remote_code: sentence-transformers' Transformer hands on no attention weights) gives
  Encoder.encode's vectors for each variant, with the sentences as they are (stripped as jaxemb strips them in
  context). The weighted sum is bounded on the scale of its terms' magnitudes, sum_t a_t |s_t|: it may cancel."""
  torch = pytest.importorskip("torch")
  method = Method("ditto", **fields)
  source = {**with_pooler, "electra": electra}[family]
  out = export.export_model(source, tmp_path / "ditto", method)
  encoder = Encoder.from_pretrained(source, method)
  model = _sentence_transformers(out)
  module = model[0]
  with torch.no_grad():
    weights, states = module.weights_and_states(module.tokenize(SENTENCES))
    magnitudes = torch.einsum("bt,bth->bh", weights, states.abs()).numpy()
  ours = encoder.encode(SENTENCES)
  assert_float32_close(model.encode(SENTENCES), ours, transformer_roundings(encoder.config), scale=magnitudes)
  assert json.loads((out / "modules.json").read_text())[0]["type"] == "jaxemb_ditto.DittoEncoder"


@pytest.mark.parametrize(
  "method",
  [
    Method("last_avg"),
    Method("prompt", template=TEMPLATES["bert"], denoise="position_offset"),
    Method("ditto", layer=1, head=2),
  ],
  ids=lambda method: method.name,
)
def test_weights_without_a_pooler_load_without_one(tiny_bert, tmp_path, capfd, method):
  """An MLM checkpoint's weights (tiny_bert's) hold no pooler: each exported module loads its BertModel without one,
  as the weights are, and transformers reports no weight drawn at random ("MISSING", the pooler's before). The
  vectors of each module against jaxemb's: the tests above, on checkpoints with a pooler."""
  out = export.export_model(tiny_bert, tmp_path / "st", method)
  capfd.readouterr()
  model = _sentence_transformers(out)
  assert "MISSING" not in capfd.readouterr().err
  assert getattr(model[0], "auto_model", getattr(model[0], "model", None)).pooler is None


def test_prompt_module_keeps_sentence_transformers_encode_keywords(with_pooler, tmp_path):
  """batch_size, normalize_embeddings, convert_to_tensor, one str, and model.similarity behave as for any model."""
  method = Method("prompt", template=TEMPLATES["bert"], denoise="position_offset")
  out = export.export_model(with_pooler["bert"], tmp_path / "prompt", method)
  model = _sentence_transformers(out)
  encoder = Encoder.from_pretrained(with_pooler["bert"], method)
  ours = encoder.encode(SENTENCES)
  norms = np.linalg.norm(ours, axis=1, keepdims=True)
  unit = ours / norms
  # Unit vectors: the vectors' tolerance over their norm (a unit vector moves by at most 2 |e| / |x|; the norms
  # and the division add h + 3 roundings of 1) and cosines, sums of h products of them, twice that.
  head = transformer_roundings(encoder.config, extra=1 + encoder.config.hidden_size + 3)
  unit_atol = 2 * float32_atol(vector_scale(encoder, ours), head) * math.sqrt(encoder.config.hidden_size) / norms.min()
  np.testing.assert_allclose(
    model.encode(SENTENCES, batch_size=1, normalize_embeddings=True), unit, rtol=0, atol=unit_atol
  )
  _assert_exported(model.encode(SENTENCES[2]), encoder, ours[2])
  tensor = model.encode(SENTENCES, convert_to_tensor=True)
  np.testing.assert_allclose(model.similarity(tensor, tensor).numpy(), unit @ unit.T, rtol=0, atol=2 * unit_atol)
  # The folder holds plain torch code: it also runs without sentence-transformers' loader.
  module = model[0].load(str(out))
  _assert_exported(module(module.tokenize(SENTENCES))["sentence_embedding"].detach().numpy(), encoder, ours)
  # model.save writes the module and its code into the root, where modules.json looks for them.
  model.save(str(tmp_path / "saved"))
  _assert_exported(_sentence_transformers(tmp_path / "saved").encode(SENTENCES), encoder, ours)


def test_trained_run_directory_exports_its_own_method_and_others(tmp_path, tiny_bert, trained_run):
  """The run's stored method ([CLS] before the pooler) and a denoised prompt through the MLM transform both carry
  over, with the trained weights."""
  trained = Encoder.from_pretrained(trained_run)
  ours = trained.encode(SENTENCES)
  theirs = _sentence_transformers_encode(export.export_model(trained_run, tmp_path / "own"))(
    [s.strip() for s in SENTENCES]
  )
  _assert_exported(theirs, trained, ours)
  untrained = Encoder.from_pretrained(tiny_bert, trained.method).encode(SENTENCES)
  assert not np.allclose(ours, untrained, atol=1e-4), "the export should hold the trained weights"
  method = Method("prompt", template=TEMPLATES["bert"], denoise="position_offset", head="mlm_transform")
  prompt = _sentence_transformers_encode(export.export_model(trained_run, tmp_path / "prompt", method))(SENTENCES)
  encoder = Encoder.from_pretrained(trained_run, method)
  _assert_exported(prompt, encoder, encoder.encode(SENTENCES))


def test_a_run_in_a_bucket_exports_into_the_bucket_and_loads_back(trained_run, bucket, tmp_path, monkeypatch, capsys):
  """The command from a run directory in a bucket to a folder there: Encoder.from_pretrained reads the exported
  folder from the bucket, sentence-transformers its local copy, both with the run's vectors; a prompt export copies
  its module there; the folder is not exported into twice, and no local `gs:` folder appears."""
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  monkeypatch.chdir(tmp_path)
  run, out = f"{bucket}/runs/r1", f"{bucket}/exported/x"
  storage.upload(trained_run, run)
  assert export.main(["--model", run, "--out", out]) == 0
  assert capsys.readouterr().out.strip() == out
  trained = Encoder.from_pretrained(trained_run)
  ours = trained.encode(SENTENCES)
  # The same weights and method through jaxemb (the same program, so bit for bit), then through torch.
  np.testing.assert_array_equal(Encoder.from_pretrained(out, "cls_before_pooler").encode(SENTENCES), ours)
  theirs = _sentence_transformers_encode(storage.local_copy(out))([s.strip() for s in SENTENCES])
  _assert_exported(theirs, trained, ours)
  card = storage.path(f"{out}/README.md").read_text()
  assert f"Encoder.from_pretrained({out!r}, Method('cls_before_pooler'))" in card  # The export, from the bucket.
  # sentence-transformers cannot open gs://: the card copies the folder down and loads it by its name.
  assert f"```bash\ngcloud storage cp -r {out} .\n```" in card
  assert [line for line in card.splitlines() if "SentenceTransformer(" in line] == [
    'model = SentenceTransformer("./x")  # This card\'s folder.'
  ]
  method = Method("prompt", template=TEMPLATES["bert"], denoise="position_offset", head="mlm_transform")
  prompt = export.export_model(run, f"{bucket}/exported/prompt", method)
  assert (prompt / f"{PROMPT_MODULE}.py").is_file()
  encoder = Encoder.from_pretrained(trained_run, method)
  _assert_exported(
    _sentence_transformers_encode(storage.local_copy(prompt))(SENTENCES), encoder, encoder.encode(SENTENCES)
  )
  assert export.main(["--model", run, "--out", out]) == 1
  assert capsys.readouterr().err.endswith(f"\nerror: {out} is not empty; export into a new directory\n")
  huggingface_hub = pytest.importorskip("huggingface_hub")
  uploads = []
  commit = huggingface_hub.CommitInfo(
    commit_url="https://huggingface.co/me/model/commit/1", commit_message="", commit_description="", oid="1"
  )
  monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo, **kw: None)
  monkeypatch.setattr(
    huggingface_hub.HfApi, "upload_folder", lambda self, **kw: uploads.append(kw["folder_path"]) or commit
  )
  assert export.push_to_hub(out, "me/model") == "https://huggingface.co/me/model"
  assert uploads == [str(storage.local_copy(out))], "a bucket's folder is uploaded from its local copy"
  assert not list(tmp_path.glob("gs:*")) and not list(tmp_path.glob("*/gs:*"))


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_an_export_a_fault_stopped_is_written_again_by_the_same_command(with_pooler, bucket, tmp_path, capsys, where):
  """A fault once the weights are written (the model card's write fails, as on a full disk or a cut connection)
  leaves the folder marked unfinished; the same command then writes it whole, saying so in one line."""
  out = str(tmp_path / "out") if where == "local" else f"{bucket}/exported/stopped"
  command = ["--model", str(with_pooler["bert"]), "--method", "last_avg", "--out", out]
  refused = f"cannot write {out}/README.md: No space left on device"
  with pytest.MonkeyPatch.context() as patched:
    patched.setattr(model_card, "write", lambda *args: (_ for _ in ()).throw(StorageError(refused)))
    assert export.main(command) == 1
  assert capsys.readouterr().err == f"error: {refused}\n"
  folder = storage.path(out)
  assert (folder / export.UNFINISHED).exists() and (folder / "model.safetensors").exists()
  assert export.main(command) == 0
  assert capsys.readouterr().err == f"note: {out} holds an export that stopped before its end: writing it again\n"
  whole = export.export_model(with_pooler["bert"], tmp_path / "whole", "last_avg")
  local = lambda folder: (p.relative_to(folder).as_posix() for p in pathlib.Path(folder).rglob("*") if p.is_file())
  files = lambda folder: sorted(storage.objects(folder) if storage.is_remote(folder) else local(folder))
  assert files(folder) == files(whole)
  assert not (folder / export.UNFINISHED).exists() and (folder / "README.md").exists()


def _card(out):
  """(the YAML metadata as the Hub's ModelCard parser reads it, the text) of an export's README.md."""
  huggingface_hub = pytest.importorskip("huggingface_hub")
  card = huggingface_hub.ModelCard.load(out / "README.md")
  return card.data.to_dict(), card.text


def test_model_card_of_a_checkpoint(with_pooler, tmp_path):
  method = Method("prompt", template=TEMPLATES["bert"], denoise="position_offset", head="pooler")
  metadata, text = _card(export.export_model(with_pooler["bert"], tmp_path / "out", method))
  assert metadata["library_name"] == "sentence-transformers" and metadata["pipeline_tag"] == "sentence-similarity"
  assert {"sentence-transformers", "jaxemb", "prompt"} <= set(metadata["tags"])
  assert "base_model" not in metadata, "a local checkpoint has no Hub id"
  assert TEMPLATES["bert"] in text and "denoising" in text and "pooler" in text and "trust_remote_code=True" in text
  # sentence-transformers loads the folder by its name, not by the exporting machine's path to it.
  assert 'SentenceTransformer("./out", trust_remote_code=True)' in text and str(tmp_path) not in text
  assert str(with_pooler["bert"]) not in text, "the exporting machine's path stays there: the card names the source"
  assert "Encoder.from_pretrained('./out', Method(" in text  # The export folder, which jaxemb reads as its source:
  ours = Encoder.from_pretrained(with_pooler["bert"], method).encode(SENTENCES)
  np.testing.assert_array_equal(Encoder.from_pretrained(tmp_path / "out", method).encode(SENTENCES), ours)
  # Without restating the template: the export recorded its method.
  loaded = Encoder.from_pretrained(tmp_path / "out")
  assert loaded.method == method
  np.testing.assert_array_equal(loaded.encode(SENTENCES), ours)
  assert "gcloud" not in text, "a local folder needs no download"
  # The jaxemb line in the card rebuilds the method.
  assert f"Method('prompt', template={TEMPLATES['bert']!r}, denoise='position_offset', head='pooler')" in text


def test_model_card_of_a_run_directory(trained_run, tmp_path):
  metadata, text = _card(export.export_model(trained_run, tmp_path / "out"))
  assert "base_model" not in metadata and "datasets" not in metadata, "a local model and corpus"
  fields = json.loads((trained_run / "fingerprint.json").read_text())["fields"]
  for key in model_card._TRAINING_FIELDS:  # pylint: disable=protected-access  # Each still names a config field.
    assert f"| `{key}` | `{fields[key]}` |" in text
  records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
  metric = "stsb_dev/STSBenchmark"  # The default eval.select_metric.
  # Step 0 is the score before training, which no checkpoint holds.
  best = max((r for r in records if metric in r and r["step"] > 0), key=lambda r: r[metric])
  assert f"`{metric}`" in text and f"step {best['step']}, {best[metric]:.2f}" in text
  assert "Method('cls_before_pooler')" in text and "trust_remote_code" not in text
  assert str(trained_run) not in text and f"(`{trained_run.name}`)" in text


def test_a_run_whose_fingerprint_does_not_read_exports_with_a_card_naming_no_training_fields(
  trained_run, tmp_path, capsys
):
  run = shutil.copytree(trained_run, tmp_path / "run")
  (run / "fingerprint.json").write_text('{"fields": {"model.path": ')
  _, text = _card(export.export_model(run, tmp_path / "out"))
  assert "`objective.loss`" not in text and "Method('cls_before_pooler')" in text
  assert capsys.readouterr().err.startswith(f"note: {run / 'fingerprint.json'} does not read (JSONDecodeError(")


def test_the_cards_method_is_python_that_builds_it():
  """A method that transforms another holds that one's own Method: its fields are not the whitening's."""
  method = Method("whitening", source=Method("prompt", template=TEMPLATES["bert"], denoise="position_offset"), dims=16)
  assert model_card._method_repr(method) == (  # pylint: disable=protected-access
    f"Method('whitening', source=Method('prompt', template={TEMPLATES['bert']!r}, denoise='position_offset'), dims=16)"
  )
  assert eval(model_card._method_repr(method), {"Method": Method}) == method  # pylint: disable=eval-used,protected-access


def test_model_card_names_hub_base_model_and_dataset():
  facts = {"base_model": "bert-base-uncased", "training": {"dataset": "princeton-nlp/datasets-for-simcse"}}
  header = model_card._metadata(Method("last_avg"), facts)  # pylint: disable=protected-access
  assert "base_model: bert-base-uncased\n" in header and "datasets:\n- princeton-nlp/datasets-for-simcse\n" in header
  assert model_card._hub_id("bert-base-uncased") == "bert-base-uncased"  # pylint: disable=protected-access
  assert model_card._hub_id("/no/such/dir/model") is None  # pylint: disable=protected-access


def test_command_line(with_pooler, tmp_path, capsys):
  """--method.FIELD=VALUE (or a space before the value) sets the named method's field as evaluate.py's
  --config.method.FIELD does, typed by its default."""
  with pytest.raises(SystemExit):  # --help lists each exportable method's fields at their defaults.
    export.main(["--help"])
  assert "\n  ditto: tokenization=in_context, layer=0, head=9, variant=first_last\n" in capsys.readouterr().out
  model = ["--model", str(with_pooler["bert"])]
  prompt = ["--method", "prompt", "--method.template", TEMPLATES["bert"], "--method.denoise=position_offset"]
  assert export.main([*model, *prompt, "--out", str(tmp_path / "out")]) == 0
  assert capsys.readouterr().out.strip() == str(tmp_path / "out")
  assert json.loads((tmp_path / "out" / "jaxemb_prompt.json").read_text())["denoise"] is True
  assert export.main([*model, "--method", "ditto", "--method.head", "3", "--out", str(tmp_path / "ditto")]) == 0
  assert Encoder.from_pretrained(tmp_path / "ditto").method == Method("ditto", head=3)
  # Not a method's field, or not of its type: argparse's usage error.
  for flags, said in [
    (["--method.template", TEMPLATES["bert"]], "--method.template needs --method"),
    (["--method", "ditto", "--method.head=first"], "--method.head=first: 'first' is not an int"),
    (["--method", "ditto", "--method.layer"], "--method.layer: expected a value"),
    (["--method", "ditto", "--layer=1"], "unrecognized arguments: --layer=1"),
  ]:
    with pytest.raises(SystemExit):
      export.main([*model, *flags, "--out", str(tmp_path / "x")])
    assert capsys.readouterr().err.strip().endswith(f"error: {said}")
  # An error a user can act on is one line and status 1: a method the export refuses; an --evaluated file that is
  # not JSON, or not an STS job's summary.
  (tmp_path / "log.json").write_text("STS12 47.1\n")
  (tmp_path / "transfer.json").write_text('{"MR": 75.1}\n')
  evaluated = "--evaluated takes the output_json of an evaluate.py STS job"
  for flags, said in [
    (["--method", "first_last_avg"], "method 'first_last_avg' has no sentence-transformers form"),
    (["--method", "last_avg", "--method.template=[X]"], "method 'last_avg' takes no template; got template='[X]'"),
    (["--evaluated", str(tmp_path / "log.json")], f"{tmp_path / 'log.json'}: not JSON (Expecting value: line 1"),
    (["--evaluated", str(tmp_path / "transfer.json")], f'{tmp_path / "transfer.json"}: no "method" entry; {evaluated}'),
  ]:
    assert export.main([*model, *flags, "--out", str(tmp_path / "y")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and err.count("\n") == 1, err


def test_method_flags_take_their_fields_types_and_a_nested_blocks_fields():
  parser = argparse.ArgumentParser()
  flags = ["--method.lowercase=False", "--method.token_rows", "mlm_decoder"]
  block = export._method_block("static_remove_biases", flags, parser)  # pylint: disable=protected-access
  assert block == {"name": "static_remove_biases", "lowercase": False, "token_rows": "mlm_decoder"}
  flags = ["--method.source.name=last_avg", "--method.dims=8", "--method.source.tokenization=alone"]
  block = export._method_block("whitening", flags, parser)  # pylint: disable=protected-access
  assert block == {"name": "whitening", "source": {"name": "last_avg", "tokenization": "alone"}, "dims": 8}
  assert Method.from_block(block).source == Method("last_avg", tokenization="alone")


def _push_args(with_pooler, tmp_path) -> list[str]:
  """export.py's command line for a last_avg export of the BERT checkpoint pushed to the hub repository me/model."""
  model, out = str(with_pooler["bert"]), str(tmp_path / "out")
  return ["--model", model, "--method", "last_avg", "--out", out, "--push_to_hub", "me/model"]


def test_push_to_hub_uploads_the_export(with_pooler, tmp_path, capsys, monkeypatch):
  """Everything up to the upload call: the repository is created and the exported folder uploaded to it."""
  huggingface_hub = pytest.importorskip("huggingface_hub")
  calls = []
  monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo, **kw: calls.append(("create", repo, kw)))
  commit = huggingface_hub.CommitInfo(
    commit_url="https://huggingface.co/me/model/commit/1", commit_message="", commit_description="", oid="1"
  )
  monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **kw: calls.append(("upload", kw)) or commit)
  assert export.main(_push_args(with_pooler, tmp_path)) == 0
  assert calls[0] == ("create", "me/model", {"repo_type": "model", "exist_ok": True})
  assert calls[1][1]["folder_path"] == str(tmp_path / "out") and calls[1][1]["repo_id"] == "me/model"
  assert capsys.readouterr().out.split() == [str(tmp_path / "out"), "https://huggingface.co/me/model"]
  assert 'SentenceTransformer("me/model")' in (tmp_path / "out" / "README.md").read_text(), "the card loads the repo"


def test_push_to_hub_offline_is_one_line(with_pooler, tmp_path, capsys, monkeypatch):
  huggingface_hub = pytest.importorskip("huggingface_hub")

  def offline(self, repo, **kwargs):
    raise huggingface_hub.errors.OfflineModeIsEnabled("Cannot reach https://huggingface.co: offline mode is enabled.")

  monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", offline)
  assert export.main(_push_args(with_pooler, tmp_path)) == 1
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "offline mode is enabled" in err
  assert err.rstrip().endswith(f"then `hf upload me/model {tmp_path / 'out'}`"), "the command that uploads it later"
  assert (tmp_path / "out" / "README.md").is_file(), "the export stays for a later upload"


def test_what_cannot_be_exported_is_refused(tiny_bert, tmp_path):
  with pytest.raises(export.NotExportable, match="first_last_avg"):
    export.export_model(tiny_bert, tmp_path / "a", "first_last_avg")
  with pytest.raises(ValueError, match="needs the checkpoint's pooler weights"):
    export.export_model(tiny_bert, tmp_path / "b", "cls")
  with pytest.raises(ValueError, match=r"name a method \(one of cls, cls_before_pooler, last_avg, ditto, prompt\)$"):
    export.export_model(tiny_bert, tmp_path / "c")
  with pytest.raises(FileNotFoundError, match=r"^\S+/missing does not exist: pass a Hugging Face model folder"):
    export.export_model(tmp_path / "missing", tmp_path / "e")  # Not "name a method": no method would find it.
  (tmp_path / "d").mkdir()
  (tmp_path / "d" / "modules.json").write_text("[]")
  with pytest.raises(FileExistsError):
    export.export_model(tiny_bert, tmp_path / "d", "last_avg")
