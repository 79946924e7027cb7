"""Token-embedding figures: piece kinds, counts, PCA, the job's PNGs and its errors."""

import json

import ml_collections
import numpy as np
import pytest

from configs import eval_token_embeddings
from jaxemb import storage
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import token_embeddings
from jaxemb.spec import TokenEmbeddingsRun
from jaxemb.testing.checkpoints import write_random_checkpoint


def test_piece_kinds_of_wordpiece_and_byte_level_bpe(bert_tokenizer, roberta_tokenizer):
  kinds = (
    (bert_tokenizer, ["##ing", "##s"], ["the", "playing", "[unused0]"], []),
    (roberta_tokenizer, ["ing", "s"], ["Ġthe", "Ġplaying"], ["ĠThe", "The"]),
  )
  for tokenizer, subwords, words, cased in kinds:
    subword, upper, special = token_embeddings.piece_kinds(tokenizer)
    ids = lambda pieces: tokenizer.convert_tokens_to_ids(pieces)
    assert subword[ids(subwords)].all() and not subword[ids(words)].any()
    assert special[tokenizer.all_special_ids].all() and not (subword | upper)[tokenizer.all_special_ids].any()
    assert upper[ids(cased)].all() and not upper[ids(words)].any()


def test_frequencies_pca_and_mean_cosine(tmp_path, bert_tokenizer):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("the cat sat\nthe dog\n\nnot counted\n")
  counts = token_embeddings.token_frequencies(str(corpus), bert_tokenizer, max_lines=3)
  assert counts[bert_tokenizer.convert_tokens_to_ids("the")] == 2 and counts.sum() == 5
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(200, 3)) * [5, 2, 0.1] + 3
  points, explained = token_embeddings.pca_2d(rows)
  np.testing.assert_allclose(np.abs(np.corrcoef(points[:, 0], rows[:, 0])[0, 1]), 1, atol=1e-2)
  assert explained[0] > 0.8 > explained[1] > 0.1
  unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
  pairs = unit @ unit.T
  np.testing.assert_allclose(token_embeddings.mean_cosine(rows), pairs[~np.eye(200, dtype=bool)].mean(), rtol=1e-9)


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  return write_random_checkpoint(tmp_path_factory.mktemp("untied-figures"), "bert", tie_word_embeddings=False)


def _config(model, out, corpus, rows="mlm_decoder"):
  """The job's spec, as evaluate.py builds it from configs/eval_token_embeddings.py with these fields."""
  config = eval_token_embeddings.get_config()
  config.model.path = str(model)
  config.token_embeddings = ml_collections.ConfigDict(
    dict(rows=rows, corpus_file=str(corpus), max_lines=0, output_dir=str(out))
  )
  return TokenEmbeddingsRun.from_config(config)


def test_job_writes_one_png_per_bias_and_refuses_bad_input(tmp_path, untied, tiny_bert):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The cat sat on the mat.\nPlaying dogs.\n")
  summary = token_embeddings.run_token_embeddings(_config(untied, tmp_path / "out", corpus))
  assert [p.rsplit("/", 1)[1] for p in summary["pngs"]] == [f"mlm_decoder_{b}.png" for b in token_embeddings.BIASES]
  for png in summary["pngs"]:
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
  assert json.loads((tmp_path / "out" / "mlm_decoder_summary.json").read_text()) == summary
  assert summary["tokens"] == 30522 - 5 and summary["cased"] < 10 and 0 < summary["seen_in_corpus"] < 12
  with pytest.raises(ConfigError, match="ties its MLM decoder to the word embeddings"):
    token_embeddings.run_token_embeddings(_config(tiny_bert, tmp_path / "tied", corpus))
  with pytest.raises(ConfigError, match="must be one of"):
    token_embeddings.run_token_embeddings(_config(untied, tmp_path / "x", corpus, rows="decoder"))
  with pytest.raises(DataError, match="corpus_file=.*no such file"):
    token_embeddings.run_token_embeddings(_config(untied, tmp_path / "x", tmp_path / "missing.txt"))


def test_job_writes_its_pngs_and_summary_into_a_bucket(tmp_path, untied, bucket, monkeypatch):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("The cat sat on the mat.\n")
  monkeypatch.chdir(tmp_path)
  summary = token_embeddings.run_token_embeddings(_config(untied, f"{bucket}/figures", corpus))
  assert summary["pngs"] == [f"{bucket}/figures/mlm_decoder_{b}.png" for b in token_embeddings.BIASES]
  for png in summary["pngs"]:
    assert storage.path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert json.loads(storage.path(f"{bucket}/figures/mlm_decoder_summary.json").read_text()) == summary
  assert not list(tmp_path.glob("gs:*"))
