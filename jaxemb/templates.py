"""Prompt templates: parsing, and the host-side batches the model reads.

A template is text with exactly one ``[X]`` (the sentence slot) and zero or
more ``[MASK]`` (the model's mask token, whatever it is spelled as), e.g.
``This sentence : "[X]" means [MASK] .``. Every row that is built from it is
``[CLS] prefix sentence suffix [SEP]`` (``<s> ... </s>`` for RoBERTa).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
import dataclasses
import itertools
import reprlib
import typing

import flax.struct
import jax
import numpy as np

from jaxemb.errors import ConfigError

# A fast Hugging Face tokenizer (offsets are needed). At run time only a name: transformers loads with the first
# tokenizer (models/hf.py), not with a command's imports (0.55 s of train.py --help's).
if typing.TYPE_CHECKING:
  from transformers import PreTrainedTokenizerBase as Tokenizer
else:
  Tokenizer = typing.Any

SLOT = "[X]"
MASK = "[MASK]"
# The row limit when the tokenizer declares none (HF's "very large" sentinel,
# which the shared BERT and RoBERTa tokenizers carry): the size of the
# position table of BERT and RoBERTa.
DEFAULT_MAX_LENGTH = 512
# Fills the slot at parse time to find the template's own tokens; a plain word
# so that it stays a separate token next to quotes, colons and spaces.
_PROBE = "hello"
# How a sentence's tokens are found: in the filled-in string, or alone
# (`tokenize_sentences`).
TOKENIZATIONS = ("in_context", "alone")

Array = np.ndarray | jax.Array
Encoding = tuple[list[int], list[tuple[int, int]]]  # Token ids, char offsets.


def slot_problem(text: str) -> str | None:
  """Why `text` cannot be a template whatever the tokenizer (None when it can): the sentence goes in one [X]. A
  config's check names its field with it, before any model loads."""
  count = text.count(SLOT)
  return None if count == 1 else f"must contain exactly one {SLOT}, found {count}"


@dataclasses.dataclass(frozen=True)
class Template:
  """A template tokenised for one tokenizer.

  Frozen and made of tuples, so it is hashable and can be a static jit
  argument. Build it with `Template.parse`.

  Attributes:
    text: the template as written, with ``[X]`` and ``[MASK]``.
    prefix_text: the text before ``[X]``, with the tokenizer's mask token.
    suffix_text: the text after ``[X]``, with the tokenizer's mask token.
    prefix_ids: template tokens before the sentence, without [CLS].
    suffix_ids: template tokens after the sentence, without [SEP].
    cls_id: the tokenizer's [CLS] (``<s>``) id.
    sep_id: the tokenizer's [SEP] (``</s>``) id.
    pad_id: the tokenizer's padding id.
    mask_id: the tokenizer's mask id.
  """

  text: str
  prefix_text: str
  suffix_text: str
  prefix_ids: tuple[int, ...]
  suffix_ids: tuple[int, ...]
  cls_id: int
  sep_id: int
  pad_id: int
  mask_id: int

  @classmethod
  def parse(cls, text: str, tokenizer: Tokenizer) -> Template:
    """Tokenises `text` with `tokenizer`.

    The template's tokens are those it gets around a probe word, so they are
    the tokens it gets in context, e.g. RoBERTa's ``Ġ'`` for ``' [X]``.

    Raises:
      ValueError: naming the template, when it has no or several ``[X]``,
        when the slot merges into template tokens even for a plain word, or
        when its mask tokens do not match its ``[MASK]`` count.
    """
    if problem := slot_problem(text):
      raise ConfigError(f"Template {text!r} {problem}.")
    prefix_text, suffix_text = text.replace(MASK, tokenizer.mask_token).split(SLOT)
    start = len(prefix_text)
    (probe,) = _tokenize(tokenizer, [prefix_text + _PROBE + suffix_text])
    prefix_ids, probe_ids, suffix_ids = _split(*probe, start, start + len(_PROBE))
    (alone,) = _tokenize_alone(tokenizer, _trailing_space(prefix_text), [_PROBE])
    if probe_ids != alone:
      raise ConfigError(
        f"Template {text!r}: the {SLOT} slot merges with the template text "
        "into one token; separate it with a space or punctuation."
      )
    template = cls(
      text=text,
      prefix_text=prefix_text,
      suffix_text=suffix_text,
      prefix_ids=prefix_ids,
      suffix_ids=suffix_ids,
      cls_id=tokenizer.cls_token_id,
      sep_id=tokenizer.sep_token_id,
      pad_id=tokenizer.pad_token_id,
      mask_id=tokenizer.mask_token_id,
    )
    if template.num_masks != text.count(MASK):
      raise ConfigError(
        f"Template {text!r} has {text.count(MASK)} {MASK} but {template.num_masks} mask tokens after tokenisation."
      )
    return template

  @property
  def mask_indices(self) -> tuple[int, ...]:
    """Index of every template mask in ``prefix_ids + suffix_ids``."""
    ids = self.prefix_ids + self.suffix_ids
    return tuple(i for i, token in enumerate(ids) if token == self.mask_id)

  @property
  def num_masks(self) -> int:
    return len(self.mask_indices)

  @property
  def num_tokens(self) -> int:
    """Length of a row with an empty sentence, [CLS] and [SEP] included."""
    return len(self.prefix_ids) + len(self.suffix_ids) + 2

  def row(self, sentence_ids: Sequence[int]) -> tuple[int, ...]:
    """The unpadded row ``[CLS] prefix sentence suffix [SEP]``."""
    return (self.cls_id,) + self.prefix_ids + tuple(sentence_ids) + self.suffix_ids + (self.sep_id,)

  def mask_positions(self, sentence_lengths: Array) -> Array:
    """Row positions of the template masks, in template order.

    Args:
      sentence_lengths: integer NumPy or JAX array of sentence token counts,
        any shape (a tracer inside jit is fine).

    Returns:
      An array ``[..., num_masks]`` of the same kind as the input.
    """
    indices = np.asarray(self.mask_indices, np.int32)
    # Masks in the suffix move right by the sentence length; +1 skips [CLS].
    after_slot = (indices >= len(self.prefix_ids)).astype(np.int32)
    return 1 + indices + after_slot * sentence_lengths[..., None]


@flax.struct.dataclass
class TemplateBatch:
  """Sentences in a template, right-padded; a pytree, so it can enter jit.

  Attributes:
    input_ids: int32 ``[B, L]``.
    attention_mask: int32 ``[B, L]``, 0 on padding.
    mask_positions: int32 ``[B, num_masks]``, the template masks in template
      order (the last one is CoT-BERT's embedding); never masks that the
      sentence itself contains.
    sentence_lengths: int32 ``[B]``, the sentence tokens kept.
  """

  input_ids: Array
  attention_mask: Array
  mask_positions: Array
  sentence_lengths: Array


def tokenize_sentences(
  template: Template,
  tokenizer: Tokenizer,
  sentences: Sequence[str],
  *,
  max_sentence_tokens: int | None = None,
  pad_to: int | None = None,
  max_length: int | None = None,
  tokenization: str = "in_context",
) -> TemplateBatch:
  """Puts every sentence in the template and tokenises it, on the host: NumPy int32 arrays.

  In context (the default), a row has exactly the ids `tokenizer` gives the filled-in template, sentences stripped
  of outer whitespace, except where a sentence merges with the template's characters (`_sentence_tokens`); an empty
  sentence gives the template alone, with sentence length 0.

  Args:
    template: the template, parsed with the same tokenizer.
    tokenizer: a fast Hugging Face tokenizer.
    sentences: the sentences, at least one.
    max_sentence_tokens: keep only each sentence's first this many tokens; the template is never truncated.
    pad_to: pad every row to this length; default: the longest row.
    max_length: the longest row allowed; default: the tokenizer's `model_max_length`, or `DEFAULT_MAX_LENGTH`.
    tokenization: one of TOKENIZATIONS: "in_context" tokenises the filled-in string, as the authors'
      `evaluation.py` does for the published numbers; "alone" puts the sentence's own tokens
      (`tokenizer.encode(s, add_special_tokens=False)`, outer spaces kept) between the template ids, as their
      training rows (`train.py` `prepare_features`) and their STS-B dev scoring (`sentemb_forward`) do. The two
      differ for RoBERTa: alone, the sentence's first word has no leading space.

  Raises:
    TypeError: when `sentences` is a str or holds a non-str (named by index).
    ValueError: no sentences, or a row longer than `max_length` or `pad_to` (the first one named by index).
  """
  sentences = check_sentences(sentences)
  if tokenization not in TOKENIZATIONS:
    raise ConfigError(f"tokenization {tokenization!r} is not one of {TOKENIZATIONS}")
  chunks = [
    _token_array(template, tokenizer, sentences[i : i + TOKENIZE_CHUNK], tokenization, max_sentence_tokens)
    for i in range(0, len(sentences), TOKENIZE_CHUNK)
  ]
  tokens, lengths = (np.concatenate(arrays) for arrays in zip(*chunks))
  row_lengths = lengths + template.num_tokens
  _check_row_lengths(row_lengths, _row_limit(tokenizer, max_length), "the maximum length; pass max_sentence_tokens")
  width = int(row_lengths.max()) if pad_to is None else pad_to
  _check_row_lengths(row_lengths, width, "pad_to")
  input_ids = _rows(template, tokens, lengths, width)
  attention_mask = np.arange(width) < row_lengths[:, None]
  return TemplateBatch(
    input_ids=input_ids,
    attention_mask=attention_mask.astype(np.int32),
    mask_positions=template.mask_positions(lengths).astype(np.int32),
    sentence_lengths=lengths,
  )


def _token_array(
  template: Template, tokenizer: Tokenizer, sentences: list[str], tokenization: str, max_sentence_tokens: int | None
) -> tuple[np.ndarray, np.ndarray]:
  """(the sentences' tokens end to end, each sentence's count): int32, each sentence cut to `max_sentence_tokens`."""
  if tokenization == "alone":
    # As is: the authors' `tokenizer.encode(s)` keeps a sentence's outer
    # spaces, which RoBERTa turns into `Ġ` tokens (NLI lines end in them).
    tokens = _ids(tokenizer, sentences)
  else:
    tokens = _sentence_tokens(template, tokenizer, [sentence.strip() for sentence in sentences])
  tokens = [t[:max_sentence_tokens] for t in tokens]
  lengths = np.array([len(t) for t in tokens], np.int32)
  return np.fromiter(itertools.chain.from_iterable(tokens), np.int32, int(lengths.sum())), lengths


def _rows(template: Template, tokens: np.ndarray, lengths: np.ndarray, width: int) -> np.ndarray:
  """``[len(lengths), width]`` int32: row i is ``template.row`` of its `lengths[i]` tokens (`tokens` holds the rows'
  tokens end to end) padded with [PAD], written with a few array operations for all rows."""
  input_ids = np.full((len(lengths), width), template.pad_id, np.int32)
  head = (template.cls_id, *template.prefix_ids)
  tail = (*template.suffix_ids, template.sep_id)
  input_ids[:, : len(head)] = head
  row_of_token = np.repeat(np.arange(len(lengths)), lengths)
  first_token = np.cumsum(lengths) - lengths
  column = len(head) + np.arange(lengths.sum()) - np.repeat(first_token, lengths)
  input_ids[row_of_token, column] = tokens
  tail_columns = len(head) + lengths[:, None] + np.arange(len(tail))
  input_ids[np.arange(len(lengths))[:, None], tail_columns] = tail
  return input_ids


def check_sentences(sentences: Sequence[str]) -> list[str]:
  """The sentences as a list, after checking their types."""
  # A lone str is a Sequence[str] too, and would be read letter by letter.
  if isinstance(sentences, str):
    raise TypeError("sentences must be a sequence of str, not one str.")
  if not sentences:
    raise ValueError("No sentences to encode.")
  for i, sentence in enumerate(sentences):
    if not isinstance(sentence, str):
      raise TypeError(f"Sentence {i} is not a str but {type(sentence).__name__} {reprlib.repr(sentence)}.")
  return list(sentences)


# Sentences tokenised at a time: the tokenizer's Python lists of ids and offsets (~100 bytes a token) live for one
# chunk, not for a whole call (an embed.py shard of 97k distinct wiki sentences: 355 -> 143 MiB of Python memory at
# its peak, the rows' arrays 109 MiB of it).
TOKENIZE_CHUNK = 4096
# The tokenizer's masks are not read: not building them as Python lists saves
# a fifth of the time of tokenising a corpus.
_IDS_ONLY = dict(return_attention_mask=False, return_token_type_ids=False)


def _tokenize(tokenizer: Tokenizer, texts: list[str]) -> list[Encoding]:
  """Ids and char offsets of each text, without special tokens."""
  backend = _plain_backend(tokenizer)
  if backend is not None:
    return [(encoding.ids, encoding.offsets) for encoding in backend.encode_batch(texts, add_special_tokens=False)]
  encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, **_IDS_ONLY)
  return list(zip(encoded["input_ids"], encoded["offset_mapping"]))


def _ids(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
  """Ids of each text, without special tokens."""
  backend = _plain_backend(tokenizer)
  if backend is not None:
    return [encoding.ids for encoding in backend.encode_batch(texts, add_special_tokens=False)]
  return tokenizer(texts, add_special_tokens=False, **_IDS_ONLY)["input_ids"]


def _plain_backend(tokenizer: Tokenizer):
  """The fast tokenizer's Rust backend when calling it directly gives what the tokenizer's own call would: it
  neither truncates nor pads, and splits special tokens' text as the tokenizer says. The call reads its result into
  per-text dicts, a quarter of the time of tokenising the wiki sample in a template (bench/embed.py on a GPU waits on
  the host). None otherwise: a freshly loaded tokenizer's backend may truncate (tokenizer.json's `truncation`), which
  the tokenizer's call turns off for good, so the first chunk goes through the call and the next ones come here."""
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None or backend.truncation is not None or backend.padding is not None:
    return None
  return backend if backend.encode_special_tokens == getattr(tokenizer, "split_special_tokens", False) else None


def _tokenize_alone(tokenizer: Tokenizer, space: str, sentences: list[str]) -> list[tuple[int, ...]]:
  """Tokenises each sentence after `space`, dropping whitespace tokens."""
  # The space makes byte-level BPE pick the word-initial tokens it would
  # pick after the template's space.
  encodings = _tokenize(tokenizer, [space + s for s in sentences])
  return [tuple(token for token, (_, end) in zip(ids, offsets) if end > len(space)) for ids, offsets in encodings]


def _trailing_space(text: str) -> str:
  return text[len(text.rstrip()) :]


def _split(
  ids: list[int], offsets: list[tuple[int, int]], start: int, end: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
  """Splits tokens by where they begin: before `start`, before `end`, after.

  A token that merges characters across `start` or `end` leaves the template
  side different from the template's own tokens (one token more or fewer).
  """
  begins = [begin for begin, _ in offsets]
  first = bisect.bisect_left(begins, start)
  last = bisect.bisect_left(begins, end)
  return tuple(ids[:first]), tuple(ids[first:last]), tuple(ids[last:])


def _sentence_tokens(template: Template, tokenizer: Tokenizer, sentences: list[str]) -> list[tuple[int, ...]]:
  """Each sentence's tokens in the template. Where a sentence merges with the template's characters next to the
  slot into one token (RoBERTa: `'[X]'` around a sentence ending in `.` gives `.'`), that sentence is tokenised
  alone after the whitespace that precedes `[X]` (so BPE picks the same word-initial tokens) and put between the
  template's own prefix and suffix ids: the template's tokens never change, which denoising and OptiPrompt rely
  on. (RoBERTa would tokenise the two spaces around an empty `' [X] '` into one more token: the callers strip.)"""
  start = len(template.prefix_text)
  filled = [template.prefix_text + s + template.suffix_text for s in sentences]
  tokens = []
  for sentence, encoding in zip(sentences, _tokenize(tokenizer, filled)):
    prefix_ids, sentence_ids, suffix_ids = _split(*encoding, start, start + len(sentence))
    in_context = (prefix_ids, suffix_ids) == (template.prefix_ids, template.suffix_ids)
    tokens.append(sentence_ids if in_context else None)
  merged = [i for i, t in enumerate(tokens) if t is None]
  if merged:
    alone = _tokenize_alone(tokenizer, _trailing_space(template.prefix_text), [sentences[i] for i in merged])
    for i, sentence_ids in zip(merged, alone):
      tokens[i] = sentence_ids
  return tokens


def _row_limit(tokenizer: Tokenizer, max_length: int | None) -> int:
  if max_length is not None:
    return max_length
  from transformers import tokenization_utils_base  # pylint: disable=import-outside-toplevel  # Loaded: a tokenizer is.

  declared = tokenizer.model_max_length
  if declared >= tokenization_utils_base.VERY_LARGE_INTEGER:
    return DEFAULT_MAX_LENGTH
  return declared


def _check_row_lengths(row_lengths: np.ndarray, limit: int, what: str):
  """Raises a ValueError naming the first row longer than `limit`."""
  too_long = np.flatnonzero(row_lengths > limit)
  if too_long.size:
    i = too_long[0]
    raise ValueError(f"Sentence {i} gives a row of {row_lengths[i]} tokens, over the limit {limit} ({what}).")
