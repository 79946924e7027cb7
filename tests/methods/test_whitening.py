"""BERT-whitening (jaxemb/methods/whitening.py): its vectors against a plain float64 NumPy whitening of the whitened
method's vectors, its k, its state saved and read back, evaluate.py's STS job, the sentence-transformers export."""

import dataclasses

import numpy as np
import pytest

from jaxemb import export
from jaxemb.encode import Encoder
from jaxemb.errors import ConfigError
from jaxemb.evaluation import run
from jaxemb.methods import Method, base
from jaxemb.models import run_dir
from jaxemb.testing.checkpoints import write_random_checkpoint
from tests.support import short_sts_job, short_stsb_test_sentences

PROMPT = 'This sentence : "[X]" means [MASK] .'


@pytest.fixture(scope="module")
def sentences():
  return short_stsb_test_sentences()


def numpy_whitening(x: np.ndarray, k: int | None = None) -> np.ndarray:
  """Su et al.'s compute_kernel_bias and transform_and_normalize (without the normalisation), in float64."""
  x = np.asarray(x, np.float64)
  mu = x.mean(axis=0, keepdims=True)
  u, s, _ = np.linalg.svd(np.cov(x.T))
  return ((x - mu) @ (u @ np.diag(s**-0.5)))[:, :k]


# A random checkpoint's LayerNorm (gain 1, bias 0) leaves each token state with zero mean over its dimensions, so
# token and [MASK] states have no variance along (1, ..., 1) (and the [MASK] state little along a few more): there
# float32 noise is all there is, and whitening scales it by 1/sqrt(s), s ~1e-7, in the float64 reference as on the
# device. Those methods keep k below such directions here; static_avg (raw word-embedding rows, no LayerNorm) keeps
# all 32.
@pytest.mark.parametrize(
  "whitened, k",
  [
    (Method("static_avg"), 0),
    (Method("first_last_avg"), 31),
    (Method("last_avg"), 8),
    (Method("prompt", template=PROMPT), 16),
  ],
)
def test_vectors_equal_a_numpy_whitening(tiny_bert, sentences, whitened, k):
  raw = Encoder.from_pretrained(tiny_bert, whitened).encode(sentences)
  encoder = Encoder.from_pretrained(tiny_bert, Method("whitening", whitened_method=whitened, whitening_dims=k))
  encoder.fit(sentences)
  vectors = encoder.encode(sentences[::-1])[::-1]
  assert vectors.shape == (len(sentences), k or 32)
  np.testing.assert_allclose(vectors, numpy_whitening(raw, k or None), atol=1e-5)
  np.testing.assert_allclose(np.cov(vectors.T), np.eye(k or 32), atol=1e-4)  # Whitened: identity covariance.


def test_the_saved_state_gives_the_same_vectors(tiny_bert, sentences, tmp_path):
  method = Method("whitening", whitened_method=Method("prompt", template=PROMPT), whitening_dims=16)
  encoder = Encoder.from_pretrained(tiny_bert, method)
  base.save_fitted(tmp_path / "whitening.npz", encoder.fit(sentences))
  again = Encoder.from_pretrained(tiny_bert, method, fitted=tmp_path / "whitening.npz")
  np.testing.assert_array_equal(again.encode(sentences), encoder.encode(sentences))
  # The kept dimensions are cut at load: the same state serves another k, not another whitened method.
  fewer = Encoder.from_pretrained(
    tiny_bert, dataclasses.replace(method, whitening_dims=8), fitted=tmp_path / "whitening.npz"
  )
  np.testing.assert_allclose(fewer.encode(sentences), encoder.encode(sentences)[:, :8], atol=1e-6)
  with pytest.raises(
    ConfigError,
    match=r"whitening.npz: the fitted state was fitted for method 'whitening' with "
    r"\{.*'whitened_method': 'prompt'\}, not for this method 'whitening'",
  ):
    Encoder.from_pretrained(
      tiny_bert, Method("whitening", whitened_method=Method("last_avg")), fitted=tmp_path / "whitening.npz"
    )


def test_the_fit_sentences_are_not_encoded_again(tiny_bert, sentences):
  """evaluate.py scores the very sentences a method fits on: with keep_vectors their vectors come from the fit's own
  embedding (no model run), equal to encoding them with the fitted state; other sentences, and the same encoder on
  other params, run the model."""
  method = Method("whitening", whitened_method=Method("first_last_avg"), whitening_dims=16)
  kept = Encoder.from_pretrained(tiny_bert, method)
  fitted = kept.fit(sentences, keep_vectors=True)
  encoding = Encoder(kept.config, kept.params, kept.tokenizer, method, fitted=fitted)
  np.testing.assert_allclose(kept.encode(sentences[::-1]), encoding.encode(sentences[::-1]), atol=1e-5)
  assert kept.real_tokens == 0 and kept.compilations == 0
  mixed = kept.encode(["a sentence the fit never saw ."] + sentences[:2])
  np.testing.assert_allclose(mixed, encoding.encode(["a sentence the fit never saw ."] + sentences[:2]), atol=1e-5)
  assert 0 < kept.real_tokens < encoding.real_tokens
  other = kept.with_params(kept.params)
  other.real_tokens = 0
  other.encode(sentences[:2])
  assert other.real_tokens > 0


def test_the_sts_job_fits_on_the_test_tasks(tiny_bert, tmp_path, capsys):
  config = short_sts_job(tiny_bert, tmp_path / "sts.json", name="whitening", whitened_method="first_last_avg")
  summary = run.run_sts(config)
  out = capsys.readouterr().out
  assert "whitening: fitted on the 72 distinct sentences of the test tasks STSBenchmark (" in out
  assert "| STSBenchmark | test  |" in out and summary["method"]["whitened_method"] == "first_last_avg"
  fitted = base.read_fitted(tmp_path / "sts.npz")
  assert fitted["mean"].shape == (32,) and fitted["kernel"].shape == (32, 32)


@pytest.mark.parametrize(
  "family, whitened", [("bert", Method("last_avg")), ("bert", Method("cls")), ("roberta", Method("cls_before_pooler"))]
)
def test_sentence_transformers_vectors_equal_jaxemb(tmp_path, sentences, family, whitened):
  sentence_transformers = pytest.importorskip("sentence_transformers")
  checkpoint = write_random_checkpoint(tmp_path / "model", family, head=False)
  method = Method("whitening", whitened_method=whitened, whitening_dims=16)
  encoder = Encoder.from_pretrained(checkpoint, method)
  base.save_fitted(tmp_path / "whitening.npz", encoder.fit(sentences))
  out = export.export_model(checkpoint, tmp_path / "st", method, fitted=tmp_path / "whitening.npz")
  theirs = sentence_transformers.SentenceTransformer(str(out), device="cpu").encode(sentences)
  np.testing.assert_allclose(theirs, encoder.encode(sentences), atol=1e-4)
  # The export keeps the state, so jaxemb reads the folder back as it was fitted.
  np.testing.assert_array_equal(Encoder.from_pretrained(str(out), method).encode(sentences), encoder.encode(sentences))


def test_flat_block_round_trip():
  method = Method("whitening", whitened_method=Method("prompt", template=PROMPT, denoise=True), whitening_dims=256)
  block = method.config_fields()
  assert block["whitened_method"] == "prompt" and block["template"] == PROMPT and block["whitening_dims"] == 256
  assert Method.from_config(block) == method and method.add_period and method.template == PROMPT
  assert Method.from_config({"name": "whitening"}) == Method("whitening", whitened_method=Method("first_last_avg"))
  assert Method("whitening", whitened_method="last_avg") == Method("whitening", whitened_method=Method("last_avg"))


# An eval_method.json as jaxemb wrote it when the Python argument was still `whitened` (the block always said
# whitened_method), for whitening_dims=16 of the denoised prompt.
WRITTEN_BEFORE_THE_RENAME = {
  "bias_positions": "from_zero",
  "denoise": "position_offset",
  "ditto_head": 9,
  "ditto_layer": 0,
  "ditto_variant": "first_last",
  "flow_batch_size": 64,
  "flow_corpus": "",
  "flow_depth": 3,
  "flow_epochs": 1,
  "flow_learning_rate": 0.001,
  "flow_levels": 3,
  "flow_seed": 0,
  "flow_width": 32,
  "flowed_method": "first_last_avg",
  "head": "none",
  "idf_path": "",
  "lowercase": True,
  "name": "whitening",
  "prompt_placement": "last_occurrence",
  "remove_frequent": True,
  "remove_punctuation": True,
  "remove_subwords": True,
  "static_rows": "word_embeddings",
  "template": PROMPT,
  "tokenization": "in_context",
  "top_k": 200,
  "whitened_method": "prompt",
  "whitening_corpus": "",
  "whitening_dims": 16,
}


def test_an_eval_method_json_written_before_the_rename_loads_and_is_written_the_same(tmp_path):
  run_dir.save_eval_method(tmp_path, WRITTEN_BEFORE_THE_RENAME)
  method = Method.from_config(run_dir.load_eval_method(tmp_path))
  assert method == Method(
    "whitening", whitened_method=Method("prompt", template=PROMPT, denoise=True), whitening_dims=16
  )
  assert method.config_fields() == {**base.block_defaults(), **WRITTEN_BEFORE_THE_RENAME}  # Families added since.


def test_bad_input_is_one_line(tiny_bert, sentences):
  with pytest.raises(ConfigError, match="^whitening_dims must be >= 0"):
    Method("whitening", whitening_dims=-1)
  with pytest.raises(ConfigError, match="^whitening_dims 64 exceeds the 32 dimensions of method 'first_last_avg'$"):
    Encoder.from_pretrained(tiny_bert, Method("whitening", whitening_dims=64))
  with pytest.raises(ConfigError, match="^whitening maps one vector per sentence; method 'ditto_all_heads'"):
    Encoder.from_pretrained(tiny_bert, Method("whitening", whitened_method=Method("ditto_all_heads", ditto_head=0)))
  with pytest.raises(ConfigError, match="^whitening transforms a method that fits nothing itself"):
    Method("whitening", whitened_method=Method("whitening"))
  encoder = Encoder.from_pretrained(tiny_bert, "whitening")
  with pytest.raises(ConfigError, match="^method 'whitening' encodes with state fitted on sentences"):
    encoder.encode(sentences)
  with pytest.raises(ConfigError, match="^whitening 32-dimensional vectors needs more than 32 distinct sentences"):
    encoder.fit(sentences[:32])


def test_the_export_command_takes_the_sts_jobs_method_and_state(tmp_path, sentences):
  sentence_transformers = pytest.importorskip("sentence_transformers")
  checkpoint = write_random_checkpoint(tmp_path / "model", "bert", head=False)
  config = short_sts_job(
    checkpoint, tmp_path / "sts.json", name="whitening", whitened_method="last_avg", whitening_dims=16
  )
  run.run_sts(config)
  assert (
    export.main(["--model", str(checkpoint), "--evaluated", str(tmp_path / "sts.json"), "--out", str(tmp_path / "st")])
    == 0
  )
  ours = Encoder.from_pretrained(checkpoint, Method.from_config(config.method), fitted=tmp_path / "sts.npz")
  theirs = sentence_transformers.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(sentences)
  np.testing.assert_allclose(theirs, ours.encode(sentences), atol=1e-4)
