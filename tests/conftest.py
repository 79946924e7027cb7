"""Shared test fixtures: the real tokenizers and tiny random checkpoints (tests/support.py writes them)."""
import pytest

from tests.support import shared_path, write_random_checkpoint


@pytest.fixture(scope="session")
def bert_tokenizer():
  import transformers
  return transformers.AutoTokenizer.from_pretrained(
      shared_path("tokenizers", "bert-base-uncased"))


@pytest.fixture(scope="session")
def roberta_tokenizer():
  import transformers
  return transformers.AutoTokenizer.from_pretrained(
      shared_path("tokenizers", "roberta-base"))


@pytest.fixture(scope="session", params=["bert", "roberta"])
def tiny_checkpoint(request, tmp_path_factory):
  """(family, directory) of a tiny random MLM checkpoint, for BERT and for RoBERTa (ELECTRA has no MLM head:
  tests/models/test_electra.py writes its own)."""
  out = tmp_path_factory.mktemp(f"tiny-{request.param}")
  return request.param, write_random_checkpoint(out, request.param)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
  """The directory of a tiny random BERT MLM checkpoint, for tests that need one family only."""
  return write_random_checkpoint(tmp_path_factory.mktemp("tiny-bert-only"), "bert")
