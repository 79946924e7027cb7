"""jaxemb.export: sentence-transformers and the README's torch code give the vectors `Encoder.encode` gives."""

import re

import numpy as np
import pytest

from jaxemb import export
from jaxemb.encode import Encoder, Method
from jaxemb.training import loop
from tests.support import shared_path, write_random_checkpoint
from tests.training.test_loop import tiny_config, wiki_head  # pylint: disable=unused-import  (a fixture)

SENTENCES = ["a man is playing a guitar .", "  A woman slices an onion!  ", "hello",
             "the quick brown fox jumps over the lazy dog , twice , before breakfast on a cold morning ."]
TEMPLATES = {"bert": 'This sentence : "[X]" means [MASK] .', "roberta": "This sentence : ' [X] ' means [MASK] ."}


@pytest.fixture(scope="module")
def with_pooler(tmp_path_factory):
  """Tiny random `*Model` checkpoints, which keep the pooler that `cls` and head "pooler" read."""
  return {family: write_random_checkpoint(tmp_path_factory.mktemp(f"pooler-{family}"), family, head=False)
          for family in ("bert", "roberta")}


def _readme_encode(out):
  """The `encode` function of the torch code in an export's README.md."""
  code = re.search(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S).group(1)
  namespace = {}
  exec(code, namespace)  # pylint: disable=exec-used
  return lambda sentences: namespace["encode"](sentences).numpy()


def _sentence_transformers_encode(out):
  sentence_transformers = pytest.importorskip("sentence_transformers")
  return sentence_transformers.SentenceTransformer(str(out), device="cpu").encode


@pytest.mark.parametrize("family, name", [("bert", "last_avg"), ("bert", "cls"), ("roberta", "last_avg"),
                                          ("roberta", "cls_before_pooler")])
def test_sentence_transformers_vectors_equal_jaxemb(with_pooler, tmp_path, family, name):
  out = export.export_model(with_pooler[family], tmp_path / "st", name)
  ours = Encoder.from_pretrained(with_pooler[family], name).encode(SENTENCES)
  # sentence-transformers does not strip sentences as jaxemb does (RoBERTa's BPE would see the spaces).
  theirs = _sentence_transformers_encode(out)([s.strip() for s in SENTENCES])
  np.testing.assert_allclose(theirs, ours, atol=1e-4)


@pytest.mark.parametrize("family, denoise, head", [("bert", False, "none"), ("roberta", False, "none"),
                                                   ("bert", True, "mlm_transform"), ("roberta", True, "pooler")])
def test_prompt_readme_code_equals_jaxemb(with_pooler, tiny_bert, tmp_path, family, denoise, head):
  source = tiny_bert if head == "mlm_transform" else with_pooler[family]  # An MLM checkpoint has no pooler.
  method = Method("prompt", template=TEMPLATES[family], denoise=denoise, head=head)
  out = export.export_model(source, tmp_path / "prompt", method)
  ours = Encoder.from_pretrained(source, method).encode(SENTENCES)
  np.testing.assert_allclose(_readme_encode(out)(SENTENCES), ours, atol=1e-4)


def test_trained_run_directory_exports_its_own_method_and_others(tmp_path, tiny_bert, wiki_head):
  """A run of one SimCSE step (the cheapest objective to compile): its stored method ([CLS] before the pooler)
  and a prompt both carry over, with the trained weights."""
  senteval = tmp_path / "senteval"  # STS-B dev cut to 40 pairs: the run evaluates it twice.
  (senteval / "STS" / "STSBenchmark").mkdir(parents=True)
  dev = shared_path("data", "senteval", "STS", "STSBenchmark", "sts-dev.csv").read_text(encoding="utf-8")
  (senteval / "STS" / "STSBenchmark" / "sts-dev.csv").write_text("".join(dev.splitlines(True)[:40]))
  run = tmp_path / "run"
  config = tiny_config("simcse", tiny_bert, run, wiki_head, num_steps=1, eval_every=1, save_every=1)
  config.data.senteval_dir = str(senteval)
  loop.train(config)
  trained = Encoder.from_pretrained(run)
  ours = trained.encode(SENTENCES)
  theirs = _sentence_transformers_encode(export.export_model(run, tmp_path / "own"))([s.strip() for s in SENTENCES])
  np.testing.assert_allclose(theirs, ours, atol=1e-4)
  untrained = Encoder.from_pretrained(tiny_bert, trained.method).encode(SENTENCES)
  assert not np.allclose(ours, untrained, atol=1e-4), "the export should hold the trained weights"
  method = Method("prompt", template=TEMPLATES["bert"])
  prompt = _readme_encode(export.export_model(run, tmp_path / "prompt", method))(SENTENCES)
  np.testing.assert_allclose(prompt, Encoder.from_pretrained(run, method).encode(SENTENCES), atol=1e-4)


def test_command_line(with_pooler, tmp_path, capsys):
  export.main(["--model", str(with_pooler["bert"]), "--method", "prompt", "--template", TEMPLATES["bert"],
               "--denoise", "--out", str(tmp_path / "out")])
  assert capsys.readouterr().out.strip() == str(tmp_path / "out")
  assert "sentence_lengths" in (tmp_path / "out" / "README.md").read_text()
  with pytest.raises(SystemExit):
    export.main(["--model", str(with_pooler["bert"]), "--template", TEMPLATES["bert"], "--out", str(tmp_path / "x")])


def test_what_cannot_be_exported_is_refused(tiny_bert, tmp_path):
  with pytest.raises(NotImplementedError, match="first_last_avg"):
    export.export_model(tiny_bert, tmp_path / "a", "first_last_avg")
  with pytest.raises(ValueError, match="needs the checkpoint's pooler weights"):
    export.export_model(tiny_bert, tmp_path / "b", "cls")
  with pytest.raises(ValueError, match="name a method"):
    export.export_model(tiny_bert, tmp_path / "c")
  (tmp_path / "d").mkdir()
  (tmp_path / "d" / "modules.json").write_text("[]")
  with pytest.raises(FileExistsError):
    export.export_model(tiny_bert, tmp_path / "d", "last_avg")
