"""PromptBERT static remove-biases avg (Sec. 3, App. A): drop biased tokens, average the static embeddings of the rest.

As kongds/Prompt-BERT's `evaluation.py` does it (`--remove_continue_word --embedding_only`): each sentence is tokenised
after a space, the word-initial pieces that are neither frequent nor punctuation are kept, lowercased and written out
each followed by a space, and that text is tokenised again (with [CLS]/[SEP]) for the average of the word-embedding
rows, [CLS] and [SEP] excluded (`pooling.static_sentence_avg`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
import dataclasses
import itertools
import re

import numpy as np

from jaxemb import templates

# PromptBERT Table 11: the top-36 frequent tokens (after Yan et al. 2021, counted on the STS data). The paper lists one
# set for both BERT vocabularies and the reference code applies it to every non-RoBERTa model. "Ġ," is spelled "Ġ, "
# (a trailing space, so it never matches) in the reference code; it is removed as punctuation there anyway.
_BERT_FREQUENT = (
  ".",
  "a",
  "the",
  "in",
  ",",
  "is",
  "to",
  "of",
  "and",
  "'",
  "on",
  "man",
  "-",
  "s",
  "with",
  "for",
  '"',
  "at",
  "##s",
  "woman",
  "are",
  "it",
  "two",
  "that",
  "you",
  "dog",
  "said",
  "playing",
  "i",
  "an",
  "as",
  "was",
  "from",
  ":",
  "by",
  "white",
)
_ROBERTA_FREQUENT = (
  "Ġ.",
  "Ġa",
  "Ġthe",
  "Ġin",
  "a",
  "Ġ,",
  "Ġis",
  "Ġto",
  "Ġof",
  "Ġand",
  "Ġon",
  "Ġ'",
  "s",
  ".",
  "the",
  "Ġman",
  "-",
  "Ġwith",
  "Ġfor",
  "Ġat",
  "Ġwoman",
  "Ġare",
  'Ġ"',
  "Ġthat",
  "Ġit",
  "Ġdog",
  "Ġsaid",
  "Ġplaying",
  "Ġwas",
  "Ġas",
  "Ġfrom",
  "Ġ:",
  "Ġyou",
  "Ġan",
  "i",
  "Ġby",
)
FREQUENT_TOKENS: dict[str, tuple[str, ...]] = {
  "bert-base-uncased": _BERT_FREQUENT,
  "bert-base-cased": _BERT_FREQUENT,
  "roberta-base": _ROBERTA_FREQUENT,
}

# WordPiece punctuation, exactly the reference's set (it includes [UNK]); byte-level BPE pieces count as punctuation
# when they hold no ASCII letter or digit (the reference's rule there, which also drops e.g. CJK words).
WORDPIECE_PUNCTUATION = frozenset("?*#´’=…|~/‚¿–»-€‘\"(•`$:[”%£<;“@_{^,.!™&]>\\')+—") | {"[UNK]"}
_ASCII_ALNUM = re.compile("[a-zA-Z0-9]")
_SPACE = "Ġ"  # Byte-level BPE's mark of a word-initial piece (RoBERTa).
_SUBWORD = "##"  # WordPiece's mark of a continuation piece (BERT).


@dataclasses.dataclass(frozen=True)
class BiasFilter:
  """Which biased tokens are dropped (the rows of PromptBERT Table 3); all on is the published method.

  Attributes:
    remove_frequent: drop the frequent tokens.
    remove_subwords: drop continuation pieces (`##` pieces; RoBERTa pieces without a leading `Ġ`).
    lowercase: lowercase what is kept (the paper's case bias; a no-op for uncased vocabularies).
    remove_punctuation: drop punctuation pieces.
    frequent_tokens: token strings; None for the published list of the tokenizer's family (`top_frequent_tokens`
      recomputes one from a corpus).
  """

  remove_frequent: bool = True
  remove_subwords: bool = True
  lowercase: bool = True
  remove_punctuation: bool = True
  frequent_tokens: tuple[str, ...] | None = None


def top_frequent_tokens(sentences: Iterable[str], tokenizer: templates.Tokenizer, k: int = 36) -> tuple[str, ...]:
  """The k most frequent tokens of a corpus, most frequent first, as token strings.

  Sentences are tokenised as they are, without special tokens, so RoBERTa's sentence-initial pieces (`the`) are
  counted apart from word-initial ones (`Ġthe`), as in the published lists.
  """
  ids = tokenizer(list(sentences), add_special_tokens=False)["input_ids"]
  counts = collections.Counter(itertools.chain.from_iterable(ids))
  return tuple(tokenizer.convert_ids_to_tokens([token for token, _ in counts.most_common(k)]))


def filter_sentences(
  tokenizer: templates.Tokenizer, sentences: Sequence[str], bias_filter: BiasFilter = BiasFilter()
) -> list[str]:
  """Each sentence as the text of its unbiased pieces, to be tokenised again with special tokens.

  Every kept word is followed by a space, and byte-level text starts with one so that its first word is word-initial
  too. An emptied WordPiece sentence becomes the pad token. As in the reference, byte-level text is never empty: its
  trailing space is one more piece, `Ġ`, and an emptied sentence is that piece alone.
  """
  rules = _Rules.of(tokenizer, bias_filter)
  lead = " " if rules.byte_level else ""
  encoded = tokenizer([" " + s for s in sentences], add_special_tokens=False)["input_ids"]
  texts = ("".join(word + " " for word in rules.kept_words(tokenizer.convert_ids_to_tokens(ids))) for ids in encoded)
  return [lead + text or tokenizer.pad_token for text in texts]


def tokenize_filtered(
  tokenizer: templates.Tokenizer,
  sentences: Sequence[str],
  bias_filter: BiasFilter = BiasFilter(),
  max_sentence_tokens: int | None = None,
) -> templates.TemplateBatch:
  """Rows `[CLS] kept pieces [SEP]` of the filtered sentences, right-padded, with no template and no [MASK]."""
  truncate = max_sentence_tokens is not None
  encoded = tokenizer(
    filter_sentences(tokenizer, sentences, bias_filter),
    padding=True,
    return_tensors="np",
    truncation=truncate,
    max_length=max_sentence_tokens + 2 if truncate else None,
  )
  attention_mask = encoded["attention_mask"].astype(np.int32)
  return templates.TemplateBatch(
    input_ids=encoded["input_ids"].astype(np.int32),
    attention_mask=attention_mask,
    mask_positions=np.zeros((len(sentences), 0), np.int32),
    sentence_lengths=attention_mask.sum(1) - 2,
  )


@dataclasses.dataclass(frozen=True)
class _Rules:
  """A `BiasFilter` applied to one tokenizer's pieces."""

  tokenizer: templates.Tokenizer
  bias_filter: BiasFilter
  frequent: frozenset[str]
  byte_level: bool  # RoBERTa's byte-level BPE marks word-initial pieces with `Ġ`; WordPiece marks continuations `##`.

  @classmethod
  def of(cls, tokenizer: templates.Tokenizer, bias_filter: BiasFilter) -> _Rules:
    (probe, *_) = tokenizer.convert_ids_to_tokens(tokenizer(" a", add_special_tokens=False)["input_ids"])
    byte_level = probe.startswith(_SPACE)
    frequent = bias_filter.frequent_tokens
    if frequent is None:
      frequent = FREQUENT_TOKENS["roberta-base" if byte_level else "bert-base-uncased"]
    return cls(tokenizer, bias_filter, frozenset(frequent), byte_level)

  def is_continuation(self, piece: str) -> bool:
    return not piece.startswith(_SPACE) if self.byte_level else piece.startswith(_SUBWORD)

  def is_punctuation(self, piece: str) -> bool:
    return _ASCII_ALNUM.search(piece) is None if self.byte_level else piece in WORDPIECE_PUNCTUATION

  def drops(self, piece: str) -> bool:
    f = self.bias_filter
    return (
      (f.remove_subwords and self.is_continuation(piece))
      or (f.remove_frequent and piece in self.frequent)
      or (f.remove_punctuation and self.is_punctuation(piece))
    )

  def text(self, piece: str) -> str:
    """The piece as text, without its `Ġ` / `##` mark."""
    # Byte-level pieces are decoded, not just stripped of `Ġ`: the reference lowercased the raw byte symbols, which
    # garbles non-ASCII words (`ĠcafÃ©`); ASCII words come out the same either way.
    word = self.tokenizer.convert_tokens_to_string([piece]).strip() if self.byte_level else piece.removeprefix(_SUBWORD)
    return word.lower() if self.bias_filter.lowercase else word

  def kept_words(self, pieces: Sequence[str]) -> list[str]:
    """The words of the pieces that are not dropped."""
    words = []
    for piece in pieces:
      word = "" if self.drops(piece) else self.text(piece)
      if not word:  # Dropped, or a whitespace piece.
        continue
      if self.is_continuation(piece) and words:
        words[-1] += word  # A kept subword rejoins the word before it: re-tokenising gives it back.
      else:
        words.append(word)
    return words
