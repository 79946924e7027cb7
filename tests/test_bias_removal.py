"""PromptBERT's biased-token filter on the real BERT and RoBERTa tokenizers, switch by switch."""

import numpy as np
import pytest

from jaxemb import bias_removal
from jaxemb.bias_removal import BiasFilter

SENTENCES = ["A man is playing a guitar.", "Unbelievably, SHE didn't go!", "the dogs ran"]


def test_published_lists_are_36_vocabulary_tokens(bert_tokenizer, roberta_tokenizer):
  lists = bias_removal.FREQUENT_TOKENS
  assert lists["bert-base-cased"] == lists["bert-base-uncased"]  # One list for both in the paper and the code.
  for name, tokenizer in (("bert-base-uncased", bert_tokenizer), ("roberta-base", roberta_tokenizer)):
    assert len(set(lists[name])) == 36
    assert set(lists[name]) <= set(tokenizer.get_vocab())
  assert set(bias_removal.WORDPIECE_PUNCTUATION) <= set(bert_tokenizer.get_vocab())


@pytest.mark.parametrize(
  "bias_filter, expected",
  [
    (BiasFilter(), ["guitar ", "un she didn t go ", "dogs ran "]),
    (BiasFilter(remove_frequent=False), ["a man is playing a guitar ", "un she didn t go ", "the dogs ran "]),
    (BiasFilter(remove_subwords=False), ["guitar ", "unbelievably she didn t go ", "dogs ran "]),
    (BiasFilter(remove_punctuation=False), ["guitar ", "un she didn t go ! ", "dogs ran "]),
    (BiasFilter(frequent_tokens=("guitar", "dogs")), ["a man is playing a ", "un she didn t go ", "the ran "]),
  ],
  ids=["all", "keep-frequent", "keep-subwords", "keep-punctuation", "own-list"],
)
def test_bert_filter(bert_tokenizer, bias_filter, expected):
  # `un ##bel ##ie ##va ##bly`, `didn ' t`: only word-initial pieces survive; the uncased vocabulary is lowercase.
  assert bias_removal.filter_sentences(bert_tokenizer, SENTENCES, bias_filter) == expected


@pytest.mark.parametrize(
  "bias_filter, expected",
  [
    # `ĠA` is not the frequent `Ġa`: the reference matches before it lowercases. `'t` is a continuation piece.
    (BiasFilter(), [" a guitar ", " un she didn go ", " dogs ran "]),
    (BiasFilter(remove_frequent=False), [" a man is playing a guitar ", " un she didn go ", " the dogs ran "]),
    (BiasFilter(remove_subwords=False), [" a guitar ", " unbelievably she didn't go ", " dogs ran "]),
    (BiasFilter(lowercase=False), [" A guitar ", " Un SHE didn go ", " dogs ran "]),
    (
      BiasFilter(remove_subwords=False, remove_punctuation=False),  # The continuation "." is a frequent token.
      [" a guitar ", " unbelievably, she didn't go! ", " dogs ran "],
    ),
    (BiasFilter(frequent_tokens=("Ġguitar",)), [" a man is playing a ", " un she didn go ", " the dogs ran "]),
  ],
  ids=["all", "keep-frequent", "keep-subwords", "keep-case", "keep-subwords-and-punctuation", "own-list"],
)
def test_roberta_filter(roberta_tokenizer, bias_filter, expected):
  assert bias_removal.filter_sentences(roberta_tokenizer, SENTENCES, bias_filter) == expected


def test_emptied_sentence(bert_tokenizer, roberta_tokenizer):
  emptied = ["the man, the dog."]
  assert bias_removal.filter_sentences(bert_tokenizer, emptied) == ["[PAD]"]
  # The reference's RoBERTa text starts with a space, so it is never empty: the space alone, one `Ġ` token.
  assert bias_removal.filter_sentences(roberta_tokenizer, emptied) == [" "]
  for tokenizer, middle in ((bert_tokenizer, "[PAD]"), (roberta_tokenizer, "Ġ")):
    rows = bias_removal.tokenize_filtered(tokenizer, emptied)
    assert tokenizer.convert_ids_to_tokens(rows.input_ids[0]) == [tokenizer.cls_token, middle, tokenizer.sep_token]


@pytest.mark.parametrize("name", ["bert_tokenizer", "roberta_tokenizer"])
def test_rows_are_the_tokenised_filtered_text(request, name):
  tokenizer = request.getfixturevalue(name)
  rows = bias_removal.tokenize_filtered(tokenizer, SENTENCES)
  expected = tokenizer(bias_removal.filter_sentences(tokenizer, SENTENCES), padding=True, return_tensors="np")
  np.testing.assert_array_equal(rows.input_ids, expected["input_ids"])
  np.testing.assert_array_equal(rows.attention_mask, expected["attention_mask"])
  np.testing.assert_array_equal(rows.sentence_lengths, expected["attention_mask"].sum(1) - 2)
  assert rows.mask_positions.shape == (len(SENTENCES), 0)
  short = bias_removal.tokenize_filtered(tokenizer, SENTENCES, max_sentence_tokens=1)
  np.testing.assert_array_equal(short.sentence_lengths, 1)
  np.testing.assert_array_equal(short.input_ids[:, :2], rows.input_ids[:, :2])


def test_top_frequent_tokens(bert_tokenizer, roberta_tokenizer):
  corpus = ["a cat sat .", "a cat ran .", "a dog ran ."]
  assert bias_removal.top_frequent_tokens(corpus, bert_tokenizer, k=2) == ("a", ".")
  # Ties keep first-seen order; k past the vocabulary of the corpus gives all of it.
  assert bias_removal.top_frequent_tokens(corpus, bert_tokenizer, k=9) == ("a", ".", "cat", "ran", "sat", "dog")
  # RoBERTa counts the sentence-initial `a` apart from the word-initial `Ġa`.
  assert bias_removal.top_frequent_tokens(["a cat", "the a"], roberta_tokenizer, k=4) == ("a", "Ġcat", "the", "Ġa")
