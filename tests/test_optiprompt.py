"""OptiPrompt's continuous template placement (jaxemb/optiprompt.py)."""

import numpy as np
import pytest

from jaxemb import optiprompt, templates


def _placed(template, batch, prompt, placement):
  embeds, mask = optiprompt.continuous_template_inputs(
    template, prompt, batch.input_ids, batch.sentence_lengths, placement
  )
  return np.asarray(embeds), np.asarray(mask)


def test_optiprompt_vectors_go_to_the_last_occurrence_of_their_token(bert_tokenizer):
  """The authors' placement: both quote vectors land on the closing quote (the later one wins), so the opening quote
  keeps its static embedding; "this" in the sentence takes the template's "this" vector; [MASK] keeps its own."""
  template = templates.Template.parse('This sentence : "[X]" means[MASK].', bert_tokenizer)
  batch = templates.tokenize_sentences(template, bert_tokenizer, ["this is it"], tokenization="alone")
  ids = batch.input_ids[0].tolist()
  tokens = bert_tokenizer.convert_ids_to_tokens(ids)
  assert tokens == ["[CLS]", "this", "sentence", ":", '"', "this", "is", "it", '"', "means", "[MASK]", ".", "[SEP]"]
  prompt = np.arange(len(template.prefix_ids) + len(template.suffix_ids), dtype=np.float32)[:, None] + 1
  embeds, mask = _placed(template, batch, prompt, "last_occurrence")
  # Template token k (prefix then suffix: this sentence : " " means [MASK] .) carries the value k + 1.
  expected = {5: 1, 2: 2, 3: 3, 8: 5, 9: 6, 11: 8}
  assert {int(i): float(embeds[0, i, 0]) for i in np.flatnonzero(mask[0])} == expected
  exact, exact_mask = _placed(template, batch, prompt, "template")
  assert {int(i): float(exact[0, i, 0]) for i in np.flatnonzero(exact_mask[0])} == {
    1: 1,
    2: 2,
    3: 3,
    4: 4,
    8: 5,
    9: 6,
    11: 8,
  }
  with pytest.raises(ValueError, match="placement 'first' is not one of"):
    _placed(template, batch, prompt, "first")
