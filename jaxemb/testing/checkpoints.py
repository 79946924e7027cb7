"""Tiny random checkpoints in Hugging Face format (written by HF PyTorch, as a user's checkpoint is), with the real
vocabularies so the real tokenizers (../shared/tokenizers) fit."""

import functools
import os
import pathlib

# ../shared beside the clone this module is in (an editable install), or $JAXEMB_SHARED: testing_support.shared's
# SHARED, which the tests and benchmarks read and the wheel leaves out, found the same way. Its tokenizers/ are read.
_SHARED = pathlib.Path(os.environ.get("JAXEMB_SHARED", pathlib.Path(__file__).resolve().parents[3] / "shared"))

_TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)
FAMILIES = {
  "bert": dict(tokenizer="bert-base-uncased", vocab_size=30522, max_position_embeddings=128),
  "roberta": dict(
    tokenizer="roberta-base",
    vocab_size=50265,
    max_position_embeddings=130,
    pad_token_id=1,
    type_vocab_size=1,
    layer_norm_eps=1e-5,
  ),
  # google/electra-*-discriminator use bert-base-uncased's vocabulary. ElectraConfig's default embedding_size
  # is 128; the same width as hidden_size unless a test overrides it (no projection).
  "electra": dict(
    tokenizer="bert-base-uncased", vocab_size=30522, max_position_embeddings=128, embedding_size=_TINY["hidden_size"]
  ),
}
# family -> (HF config class, model with its pretraining head, base model). ELECTRA's head is the discriminator's.
_HF_CLASSES = {
  "bert": ("BertConfig", "BertForMaskedLM", "BertModel"),
  "roberta": ("RobertaConfig", "RobertaForMaskedLM", "RobertaModel"),
  "electra": ("ElectraConfig", "ElectraForPreTraining", "ElectraModel"),
}


def write_random_checkpoint(
  out_dir, family: str, head: bool = True, seed: int = 0, init_std: float | None = 0.1, **overrides
):
  """Writes a randomly initialised HF model with its pretraining head (`*ForMaskedLM`, ELECTRA's
  `ElectraForPreTraining`), or `*Model` without it, and its tokenizer.

  Weights are drawn wider than HF's init (`init_std` 0.1, LayerNorm scales around 1) so attention is peaked and
  every parameter matters to the outputs the tests compare; `init_std=None` keeps HF's init (the benchmarks'
  bert-base, which must stay finite through 12 layers in fp16).
  """
  import torch  # pylint: disable=import-outside-toplevel  # Here: a test process that writes none loads no torch.
  import transformers  # pylint: disable=import-outside-toplevel

  spec = dict(FAMILIES[family])
  tokenizer_name = spec.pop("tokenizer")
  config_name, head_model_name, base_model_name = _HF_CLASSES[family]
  config = getattr(transformers, config_name)(**{**_TINY, **spec, **overrides})
  model_cls = getattr(transformers, head_model_name if head else base_model_name)
  torch.manual_seed(seed)
  model = model_cls(config)
  with torch.no_grad():
    for name, p in model.named_parameters() if init_std is not None else ():
      p.normal_(0.0, init_std)
      if "LayerNorm.weight" in name or "layer_norm.weight" in name:
        p.add_(1.0)
  model.save_pretrained(out_dir)
  hf_tokenizer(_SHARED / "tokenizers" / tokenizer_name).save_pretrained(out_dir)
  return out_dir


def hf_tokenizer(path: str | os.PathLike):
  """AutoTokenizer of the folder `path`, loaded once per process (0.2-0.7 s a load on the Zen 3: ~100 worker-s of
  the README tier went to tokenizer loads): the shared tokenizers the checkpoints are written with, and the tests'
  HF references. Read-only: its callers share it (saving it does not change it)."""
  return _hf_tokenizer(str(path))


@functools.cache
def _hf_tokenizer(path: str):
  import transformers  # pylint: disable=import-outside-toplevel

  return transformers.AutoTokenizer.from_pretrained(path)
