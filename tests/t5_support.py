"""Tiny random T5 checkpoints in Hugging Face format and the small T5 tokenizer they use (no sentencepiece model is
available offline: a Unigram tokenizer trained on a few sentences, with T5's special tokens and sentinels)."""

import json
import pathlib
import re

# What the tokenizer is trained on: the words the tests feed the generator.
CORPUS = (
  "orange: a large round juicy citrus fruit with a tough bright reddish-yellow rind",
  "apple: fruit with red or yellow or green skin and sweet to tart crisp whitish flesh",
  "guitar: a stringed instrument usually having six strings; played by strumming or plucking",
  "river: a large natural stream of water. Also called a stream; this word means something.",
  "This sentence means a word . It is also known as the name of a thing , called this",
)
# The two kinds of checkpoints: T5 v1.0 (ReLU, LM head tied to the embedding and scaled) and v1.1 (gated GELU,
# untied head, no scaling).
VARIANTS = {"t5": dict(feed_forward_proj="relu"), "t5_v1_1": dict(feed_forward_proj="gated-gelu", untied=True)}
# One layer count for both stacks: transformers 5 sizes the decoder's generation cache by num_layers.
_TINY = dict(
  d_model=32,
  d_kv=8,
  d_ff=48,
  num_layers=2,
  num_heads=4,
  relative_attention_num_buckets=8,
  relative_attention_max_distance=20,
  dropout_rate=0.0,
)


def t5_roundings(config, encoder_length, decoder_length):
  """A T5's logits in tests/support.py's float32_atol's roundings: per encoder layer an RMSNorm (d + 3), the
  attention's projections, scores with their bias, softmax, context and output (d + d_kv + 2 + 2L + 3 + d + 1), an
  RMSNorm and the feed-forward (d + 3 + d + 6 + d_ff + 1); per decoder layer the same with the cross-attention's
  over the encoder's L besides; the final RMSNorms and the head's dot (d + 2)."""
  d, kv, ff = config.d_model, config.d_kv, config.d_ff
  attention = lambda length: d + kv + 2 + 2 * length + 3 + d + 1
  norm_ffn = d + 3 + d + 6 + ff + 1
  encoder = config.num_layers * (d + 3 + attention(encoder_length) + norm_ffn)
  decoder = config.num_decoder_layers * (2 * (d + 3) + attention(decoder_length) + attention(encoder_length) + norm_ffn)
  return encoder + decoder + 2 * (d + 3) + d + 2


def t5_tokenizer(sentinels: int = 10):
  """A T5 tokenizer (Metaspace Unigram, `<pad>` 0, `</s>` 1, `<unk>` 2, `<extra_id_N>` sentinels) whose pieces are
  CORPUS's words and punctuation (whole words preferred) and its characters. Built from that list, not trained:
  tokenizers' Unigram trainer gives another vocabulary on each run."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers
  import transformers

  words = sorted({w for line in CORPUS for w in re.findall(r"\w+|[^\w\s]", line)})
  chars = sorted({c for line in CORPUS for c in line if not c.isspace()})
  pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
  pieces += [(p, -1.0) for w in words for p in ("▁" + w, w)] + [(c, -4.0) for c in chars if c not in words]
  tokenizer = tokenizers.Tokenizer(models.Unigram(pieces, unk_id=2))
  tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
  tokenizer.decoder = decoders.Metaspace()
  return transformers.T5TokenizerFast(
    tokenizer_object=tokenizer, extra_ids=sentinels, eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
  )


def write_tiny_t5(out_dir, variant: str, seed: int = 0, boost: dict[str, float] | None = None):
  """Writes a random `T5ForConditionalGeneration` of `variant` (a key of VARIANTS) and its tokenizer to out_dir.

  `boost` (token -> factor) multiplies the output embeddings of those tokens: their logits then spread wider, so a
  random model emits them at times (`</s>`: some beams end early; sentinels: spans close).
  The untied variant's `lm_head.weight` is written beside `shared.weight` with other values and
  `tie_word_embeddings: false` in config.json, as v1.1 checkpoints are: transformers 5 then loads it untied.
  """
  import numpy as np
  from safetensors.numpy import load_file, save_file
  import torch
  import transformers

  spec = dict(VARIANTS[variant])
  untied = spec.pop("untied", False)
  tokenizer = t5_tokenizer()
  config = transformers.T5Config(vocab_size=len(tokenizer), decoder_start_token_id=0, **_TINY, **spec)
  torch.manual_seed(seed)
  model = transformers.T5ForConditionalGeneration(config)
  model.save_pretrained(out_dir)
  tokenizer.save_pretrained(out_dir)
  out = pathlib.Path(out_dir)
  state = load_file(str(out / "model.safetensors"))
  if untied:
    state["lm_head.weight"] = np.random.default_rng(seed).normal(size=state["shared.weight"].shape).astype("f4")
  for token, factor in (boost or {}).items():
    state["lm_head.weight" if untied else "shared.weight"][tokenizer.convert_tokens_to_ids(token)] *= factor
  save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
  if untied:
    hf_config = json.loads((out / "config.json").read_text())
    hf_config.pop("scale_decoder_outputs", None)
    (out / "config.json").write_text(json.dumps({**hf_config, "tie_word_embeddings": False}))
  return out
