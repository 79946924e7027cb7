"""Ditto as a sentence-transformers module: the file `jaxemb.export` copies into an exported folder.

Not imported by jaxemb (it needs torch); the export copies it as `jaxemb_ditto.py` beside `jaxemb_ditto.json` and the
Hugging Face checkpoint, and its modules.json names `jaxemb_ditto.DittoEncoder`, which
`SentenceTransformer(folder, trust_remote_code=True)` loads (sentence-transformers' Transformer module hands on no
attention weights, which Ditto reads). It stands alone in the folder it is copied into, so its load and save
repeat st_prompt_module.py's. Without sentence-transformers:

  module = DittoEncoder.load(folder)
  vectors = module(module.tokenize(sentences))["sentence_embedding"]

What it computes is jaxemb's `ditto` method (jaxemb/methods/ditto.py, jaxemb/pooling.py), after Chen et al. (2023),
alibaba-damo-academy/SpokenNLP `ditto/`:

  row    = [CLS] sentence [SEP]
  a_t    = head `head` of layer `layer`'s attention of token t to itself, 0 at padding
  vector = sum_t a_t s_t, s the `variant`'s token vectors: (h0 + hL) / 2, hL, h0 or the raw word embeddings
"""

import json
import os

import torch
import transformers

CONFIG_FILE = "jaxemb_ditto.json"


class DittoEncoder(torch.nn.Module):
  """The token vectors weighted by one attention head's diagonal, summed."""

  # `SentenceTransformer.save` writes this module (weights, tokenizer, config and a copy of this file) into the
  # model's root, where modules.json's "jaxemb_ditto.DittoEncoder" is looked for.
  save_in_root = True

  def __init__(self, model, tokenizer, config):
    super().__init__()
    self.model = model
    self.tokenizer = tokenizer
    self.config = config
    self.max_seq_length = config["max_length"]

  @classmethod
  def load(cls, input_path):
    with open(os.path.join(input_path, CONFIG_FILE), encoding="utf-8") as f:
      config = json.load(f)
    # The eager attention computes the probabilities it returns; the fused kernels return none.
    # model_kwargs: no pooler where the weights have none (jaxemb's export writes them).
    model = transformers.AutoModel.from_pretrained(
      input_path, attn_implementation="eager", **config.get("model_kwargs", {})
    ).eval()
    return cls(model, transformers.AutoTokenizer.from_pretrained(input_path), config)

  def save(self, output_path, *args, **kwargs):
    del args, kwargs
    self.model.save_pretrained(output_path)
    self.tokenizer.save_pretrained(output_path)
    with open(os.path.join(output_path, CONFIG_FILE), "w", encoding="utf-8") as f:
      json.dump(self.config, f, indent=2)

  def tokenize(self, texts, **kwargs):
    """input_ids and attention_mask, right-padded: each sentence stripped (tokenization "in_context", jaxemb's
    default) or as it is ("alone"), between the model's own first and last special tokens."""
    del kwargs
    strip = self.config["tokenization"] == "in_context"
    return self.tokenizer(
      [text.strip() if strip else text for text in texts],
      padding=True,
      truncation=True,
      max_length=self.max_seq_length,
      return_tensors="pt",
      return_token_type_ids=False,
    )

  def weights_and_states(self, features):
    """([batch, length] the head's diagonal at the real tokens, [batch, length, width] the variant's vectors)."""
    c = self.config
    out = self.model(
      input_ids=features["input_ids"],
      attention_mask=features["attention_mask"],
      output_attentions=True,
      output_hidden_states=True,
    )
    weights = torch.diagonal(out.attentions[c["layer"]][:, c["head"]], dim1=-2, dim2=-1) * features["attention_mask"]
    states = {
      "first_last": lambda: (out.hidden_states[0] + out.hidden_states[-1]) / 2,
      "last": lambda: out.last_hidden_state,
      "embedding_output": lambda: out.hidden_states[0],
      "static": lambda: self.model.get_input_embeddings()(features["input_ids"]),
    }[c["variant"]]()
    return weights.to(states.dtype), states

  def forward(self, features, **kwargs):
    del kwargs
    weights, states = self.weights_and_states(features)
    features["sentence_embedding"] = torch.einsum("bt,bth->bh", weights, states)
    return features
