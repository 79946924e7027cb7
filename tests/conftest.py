"""Shared test fixtures: the ../shared folder and its real tokenizers."""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("JAXEMB_SHARED", REPO.parent / "shared"))


def shared_path(*parts: str) -> pathlib.Path:
  """A path under ../shared; skips the test when it is not there."""
  path = SHARED.joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} is not available (set JAXEMB_SHARED)")
  return path


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


# Tiny random checkpoints in Hugging Face format, with the real vocabularies so the real tokenizers fit.
_TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)
FAMILIES = {
    "bert": dict(tokenizer="bert-base-uncased", vocab_size=30522, max_position_embeddings=128),
    "roberta": dict(tokenizer="roberta-base", vocab_size=50265, max_position_embeddings=130, pad_token_id=1,
                    type_vocab_size=1, layer_norm_eps=1e-5),
    # google/electra-*-discriminator use bert-base-uncased's vocabulary. ElectraConfig's default embedding_size
    # is 128; the same width as hidden_size unless a test overrides it (no projection).
    "electra": dict(tokenizer="bert-base-uncased", vocab_size=30522, max_position_embeddings=128,
                    embedding_size=_TINY["hidden_size"]),
}
# family -> (HF config class, model with its pretraining head, base model). ELECTRA's head is the discriminator's.
_HF_CLASSES = {"bert": ("BertConfig", "BertForMaskedLM", "BertModel"),
               "roberta": ("RobertaConfig", "RobertaForMaskedLM", "RobertaModel"),
               "electra": ("ElectraConfig", "ElectraForPreTraining", "ElectraModel")}


def write_random_checkpoint(out_dir, family: str, head: bool = True, seed: int = 0, **overrides):
  """Writes a randomly initialised HF model with its pretraining head (`*ForMaskedLM`, ELECTRA's
  `ElectraForPreTraining`), or `*Model` without it, and its tokenizer.

  Weights are drawn wider than HF's init (std 0.1, LayerNorm scales around 1) so attention is peaked and
  every parameter matters to the outputs the tests compare.
  """
  import torch
  import transformers
  spec = dict(FAMILIES[family])
  tokenizer_name = spec.pop("tokenizer")
  config_name, head_model_name, base_model_name = _HF_CLASSES[family]
  config = getattr(transformers, config_name)(**{**_TINY, **spec, **overrides})
  model_cls = getattr(transformers, head_model_name if head else base_model_name)
  torch.manual_seed(seed)
  model = model_cls(config)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.normal_(0.0, 0.1)
      if "LayerNorm.weight" in name or "layer_norm.weight" in name:
        p.add_(1.0)
  model.save_pretrained(out_dir)
  transformers.AutoTokenizer.from_pretrained(shared_path("tokenizers", tokenizer_name)).save_pretrained(out_dir)
  return out_dir


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
