"""The sentences, the template and the HF PyTorch oracle of tests/test_encode.py, which tests of other encoders
(ELECTRA) share: each method's definition written out on HF PyTorch outputs."""

import json

import numpy as np
import torch
import transformers

from jaxemb import bias_removal
from jaxemb.encode import Method
from jaxemb.testing.hf_poolings import HIDDEN_STATE_POOLINGS
from jaxemb.testing.checkpoints import hf_tokenizer

SENTENCES = [
  "a man is playing a guitar .",
  "A woman slices an onion!",
  "hello",
  "a man is playing a guitar .",
  "the quick brown fox jumps over the lazy dog , twice , before breakfast on a cold morning .",
]
PROMPT = 'This sentence : "[X]" means [MASK] .'


def remove_continue_word(tokenizer, sentence):
  """Prompt-BERT's `--remove_continue_word` text for a WordPiece model: frequent, punctuation and ## pieces go."""
  pieces = tokenizer.convert_ids_to_tokens(tokenizer.encode(" " + sentence, add_special_tokens=False))
  frequent, punctuation = bias_removal.FREQUENT_TOKENS["bert-base-uncased"], bias_removal.WORDPIECE_PUNCTUATION
  kept = "".join(w.lower() + " " for w in pieces if w not in frequent and w not in punctuation and "##" not in w)
  return kept or "[PAD]"


def torch_reference(path, method: Method, sentences):
  """The method's definition written out on HF PyTorch outputs (eager attention for the probabilities)."""
  tokenizer = hf_tokenizer(path)
  head = method.name == "prompt_mlm_top_k" or getattr(method, "token_rows", None) == "mlm_decoder"
  model_cls = transformers.AutoModelForMaskedLM if head else transformers.AutoModel
  model = model_cls.from_pretrained(path, attn_implementation="eager").eval()
  if method.name == "static_remove_biases":
    texts = [remove_continue_word(tokenizer, s) for s in sentences]
  else:
    texts = [method.template.replace("[MASK]", tokenizer.mask_token).replace("[X]", s.strip()) for s in sentences]
  batch = tokenizer(texts, padding=True, return_tensors="pt")
  with torch.no_grad():
    out = model(**batch, output_hidden_states=True, output_attentions=True)
  hidden = [h.double().numpy() for h in out.hidden_states]
  mask = batch["attention_mask"].double().numpy()[..., None]
  mean = lambda x: (x * mask).sum(1) / mask.sum(1)
  encoder = model.base_model
  if method.name == "cls":
    return out.pooler_output.numpy()
  if method.name in HIDDEN_STATE_POOLINGS:
    return HIDDEN_STATE_POOLINGS[method.name](hidden, mask)
  if method.name in ("static_avg", "static_remove_biases"):
    ids = batch["input_ids"].numpy()
    rows = model.cls.predictions.decoder if method.token_rows == "mlm_decoder" else encoder.embeddings.word_embeddings
    words = rows.weight.detach().double().numpy()[ids]
    if method.name == "static_avg":
      return mean(words)
    kept = mask * ((ids != tokenizer.cls_token_id) & (ids != tokenizer.sep_token_id))[..., None]
    return (words * kept).sum(1) / kept.sum(1)
  if method.name == "tfidf_first_last":
    with open(method.idf_path) as f:
      idf = {int(token): value for token, value in json.load(f).items()}
    weights = np.vectorize(lambda token: idf.get(token, 0.0))(batch["input_ids"].numpy())[..., None] * mask
    return ((hidden[0] + hidden[-1]) / 2 * weights).sum(1)
  if method.name == "ditto":
    attention = out.attentions[method.layer][:, method.head].double().numpy()
    diagonal = np.einsum("btt->bt", attention)[..., None] * mask
    words = encoder.embeddings.word_embeddings.weight.detach().double().numpy()[batch["input_ids"].numpy()]
    # alibaba-damo-academy/SpokenNLP ditto: "static" weights the raw word-embedding rows, not h0.
    states = {
      "first_last": (hidden[0] + hidden[-1]) / 2,
      "last": hidden[-1],
      "static": words,
      "embedding_output": hidden[0],
    }[method.variant]
    return (states * diagonal).sum(1)
  rows = np.arange(len(texts))
  last_mask = np.array([np.flatnonzero(ids == tokenizer.mask_token_id)[-1] for ids in batch["input_ids"].numpy()])
  if method.name == "prompt":
    return hidden[-1][rows, last_mask]
  probs = torch.softmax(out.logits[rows, last_mask].double(), -1).numpy()
  top = np.argsort(-probs, axis=-1)[:, : method.top_k]
  weights = np.take_along_axis(probs, top, -1)
  weights /= weights.sum(-1, keepdims=True)
  table = encoder.embeddings.word_embeddings.weight.detach().double().numpy()
  return np.einsum("bk,bkh->bh", weights, table[top])
