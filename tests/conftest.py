"""Shared test fixtures: the real tokenizers and tiny random checkpoints (tests/support.py writes them)."""
import shutil
import tempfile

import pytest

from tests.support import shared_path, write_random_checkpoint

_XLA_CACHE = tempfile.mkdtemp(prefix="jaxemb-tests-xla-")


def pytest_configure(config):  # pylint: disable=unused-argument
  """JAX's persistent compilation cache for this pytest process, in a folder of its own: tests build new jitted
  functions of the same tiny models and shapes (an Encoder, a Trainer, a jitted step per test), which JAX's
  in-memory cache, keyed by function, misses and this one, keyed by program, hits. Subprocesses keep their own."""
  import jax  # pylint: disable=import-outside-toplevel
  jax.config.update("jax_compilation_cache_dir", _XLA_CACHE)


def pytest_unconfigure(config):  # pylint: disable=unused-argument
  shutil.rmtree(_XLA_CACHE, ignore_errors=True)


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
