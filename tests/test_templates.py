"""Tests for jaxemb.templates against the real BERT and RoBERTa tokenizers."""

import re

import numpy as np
import pytest

from jaxemb import templates
from tests.support import shared_path

BERT_TEMPLATES = (
  'This sentence : "[X]" means [MASK] .',
  'This sentence of "[X]" means [MASK] .',
  'The sentence of "[X]" means [MASK], so it can be summarized as [MASK].',
  'The sentence : "[X]" means [MASK], so it can be summarized as [MASK].',
  'The sentence : "[X]" does not mean [MASK], so it cannot be summarized as [MASK].',
  "[X]",
)
ROBERTA_TEMPLATES = (
  "This sentence : ' [X] ' means [MASK] .",
  "The sentence : ' [X] ' means [MASK] .",
  "The sentence of '[X]' means [MASK], so it can be summarized as [MASK].",
  "The sentence : '[X]' means [MASK], so it can be summarized as [MASK].",
  "The sentence : '[X]' does not mean [MASK], so it cannot be summarized as [MASK].",
  "[X]",
)
COT_BERT = BERT_TEMPLATES[2]
COT_ROBERTA = ROBERTA_TEMPLATES[2]
LONG = " ".join(["The quick brown fox, aged 7, jumps over 12 lazy dogs"] * 20)
# None ends in punctuation, which RoBERTa would merge with a closing "'".
SENTENCES = (
  "A man is playing a guitar",
  "a [MASK] sits on the <mask> mat [SEP] then </s> leaves",
  "she said \"hello\" and he said 'bye' to them",
  "this sentence means what the sentence means",
  "café naïve Straße",
  "東京は日本の首都です",
  "🙂👍 great",
  "3.14 is about 22/7 and 1,000,000 is big",
  "  spaces around  ",
  LONG,
)
CASES = [("bert_tokenizer", t) for t in BERT_TEMPLATES] + [("roberta_tokenizer", t) for t in ROBERTA_TEMPLATES]


def filled_ids(tokenizer, text, sentence):
  """What the tokenizer gives the filled-in template, with special tokens."""
  text = text.replace("[MASK]", tokenizer.mask_token)
  return tokenizer(text.replace("[X]", sentence.strip()))["input_ids"]


def encode(tokenizer, text, sentences, **kwargs):
  template = templates.Template.parse(text, tokenizer)
  return template, templates.tokenize_sentences(template, tokenizer, sentences, **kwargs)


@pytest.fixture(params=CASES, ids=lambda case: case[1])
def case(request):
  name, text = request.param
  return request.getfixturevalue(name), text


def test_rows_equal_filled_template_tokens(case):
  tokenizer, text = case
  template, batch = encode(tokenizer, text, SENTENCES)
  for i, sentence in enumerate(SENTENCES):
    expected = filled_ids(tokenizer, text, sentence)
    row = batch.input_ids[i]
    np.testing.assert_array_equal(row[: len(expected)], expected)
    assert np.all(row[len(expected) :] == template.pad_id)
    np.testing.assert_array_equal(batch.attention_mask[i], np.arange(row.size) < len(expected))
    assert batch.sentence_lengths[i] == len(expected) - template.num_tokens
  assert batch.input_ids.shape[1] == batch.attention_mask.sum(1).max()
  for array in (batch.input_ids, batch.attention_mask, batch.mask_positions, batch.sentence_lengths):
    assert array.dtype == np.int32


def test_mask_positions_are_the_template_masks_only(case):
  tokenizer, text = case
  template, batch = encode(tokenizer, text, SENTENCES)
  assert template.num_masks == text.count("[MASK]")
  assert batch.mask_positions.shape == (len(SENTENCES), template.num_masks)
  picked = np.take_along_axis(batch.input_ids, batch.mask_positions, axis=1)
  assert np.all(picked == template.mask_id)
  # Sentence 1 brings a mask token of its own, which must not be counted.
  assert np.sum(batch.input_ids[1] == template.mask_id) > template.num_masks


def test_truncation_keeps_first_sentence_tokens_and_template(case):
  tokenizer, text = case
  template, full = encode(tokenizer, text, [LONG])
  _, cut = encode(tokenizer, text, [LONG], max_sentence_tokens=8)
  start = 1 + len(template.prefix_ids)
  in_context = full.input_ids[0, start : start + full.sentence_lengths[0]]
  assert cut.sentence_lengths.tolist() == [8]
  np.testing.assert_array_equal(cut.input_ids[0], template.row(in_context[:8]))
  assert cut.attention_mask.sum() == template.num_tokens + 8
  np.testing.assert_array_equal(cut.mask_positions, template.mask_positions(np.array([8])))


@pytest.mark.parametrize("tokenization", templates.TOKENIZATIONS)
def test_sentences_tokenised_a_chunk_at_a_time_give_the_rows_of_one_call(case, tokenization, monkeypatch):
  # Chunks of 5 of the 12 sentences: the last one partial, with CoT-RoBERTa's boundary merge ("It works.'") in it.
  tokenizer, text = case
  sentences = [*SENTENCES, "It works.", ""]
  _, whole = encode(tokenizer, text, sentences, max_sentence_tokens=24, tokenization=tokenization)
  monkeypatch.setattr(templates, "TOKENIZE_CHUNK", 5)
  _, chunked = encode(tokenizer, text, sentences, max_sentence_tokens=24, tokenization=tokenization)
  for field in ("input_ids", "attention_mask", "mask_positions", "sentence_lengths"):
    np.testing.assert_array_equal(getattr(chunked, field), getattr(whole, field), err_msg=field)
    assert getattr(chunked, field).dtype == np.int32


@pytest.mark.parametrize("tokenization", templates.TOKENIZATIONS)
def test_the_backend_called_directly_gives_the_rows_of_the_tokenizers_call(case, tokenization, monkeypatch):
  # The shared tokenizers neither truncate nor pad, so they take the direct path; CoT-RoBERTa's merge is in here too.
  tokenizer, text = case
  sentences = [*SENTENCES, "It works.", ""]
  assert templates._plain_backend(tokenizer) is tokenizer.backend_tokenizer
  _, direct = encode(tokenizer, text, sentences, tokenization=tokenization)
  monkeypatch.setattr(templates, "_plain_backend", lambda _: None)
  _, called = encode(tokenizer, text, sentences, tokenization=tokenization)
  for field in ("input_ids", "attention_mask", "mask_positions", "sentence_lengths"):
    np.testing.assert_array_equal(getattr(direct, field), getattr(called, field), err_msg=field)


def test_a_backend_that_truncates_is_not_called_directly(monkeypatch):
  """MiniLM's tokenizer.json truncates at 128 tokens; a fresh tokenizer's first chunk goes through its call, which
  turns that off, and the next chunks through the backend: no row is cut."""
  import transformers  # pylint: disable=import-outside-toplevel

  tokenizer = transformers.AutoTokenizer.from_pretrained(shared_path("models", "all-MiniLM-L6-v2"))
  assert tokenizer.backend_tokenizer.truncation["max_length"] == 128 and templates._plain_backend(tokenizer) is None
  monkeypatch.setattr(templates, "TOKENIZE_CHUNK", 1)
  sentences = [LONG, "A man is playing a guitar", LONG + " again"]
  template, batch = encode(tokenizer, BERT_TEMPLATES[0], sentences)
  assert templates._plain_backend(tokenizer) is tokenizer.backend_tokenizer
  expected = [filled_ids(tokenizer, BERT_TEMPLATES[0], sentence) for sentence in sentences]
  assert [len(ids) > 128 for ids in expected] == [True, False, True]
  for row, length, ids in zip(batch.input_ids, batch.attention_mask.sum(1), expected):
    np.testing.assert_array_equal(row[:length], ids)


@pytest.mark.parametrize("sentence", ["", "   ", "\t\n"])
def test_empty_sentence_is_the_template_alone(case, sentence):
  tokenizer, text = case
  template, batch = encode(tokenizer, text, [sentence])
  np.testing.assert_array_equal(batch.input_ids[0], template.row(()))
  assert batch.sentence_lengths.tolist() == [0]
  np.testing.assert_array_equal(batch.mask_positions[0], 1 + np.array(template.mask_indices))


def test_template_fields(bert_tokenizer, roberta_tokenizer):
  bert = templates.Template.parse(BERT_TEMPLATES[0], bert_tokenizer)
  tokens = bert_tokenizer.convert_ids_to_tokens
  assert tokens(bert.prefix_ids) == ["this", "sentence", ":", '"']
  assert tokens(bert.suffix_ids) == ['"', "means", "[MASK]", "."]
  assert (bert.cls_id, bert.sep_id, bert.pad_id, bert.mask_id) == (101, 102, 0, 103)
  roberta = templates.Template.parse(ROBERTA_TEMPLATES[0], roberta_tokenizer)
  # The space before [X] belongs to the sentence's first token, not here.
  assert roberta_tokenizer.convert_ids_to_tokens(roberta.prefix_ids) == ["This", "Ġsentence", "Ġ:", "Ġ'"]
  assert (roberta.cls_id, roberta.sep_id, roberta.pad_id, roberta.mask_id) == (0, 2, 1, 50264)
  assert templates.Template.parse(COT_ROBERTA, roberta_tokenizer).num_masks == 2
  assert templates.Template.parse("[X]", roberta_tokenizer).num_masks == 0
  # Hashable and compared by value, as a static jit argument must be.
  assert hash(bert) == hash(templates.Template.parse(BERT_TEMPLATES[0], bert_tokenizer))


@pytest.mark.parametrize(
  "text",
  [
    "This sentence means [MASK] .",
    'Both "[X]" and "[X]" mean [MASK] .',
    "This sentence : <mask> ' [X] ' means [MASK] .",
    "abc[X]def [MASK]",
  ],
)
def test_bad_template_raises_naming_it(roberta_tokenizer, text):
  with pytest.raises(ValueError, match=re.escape(repr(text))):
    templates.Template.parse(text, roberta_tokenizer)


@pytest.mark.parametrize(
  "text, alone",
  [
    (COT_ROBERTA, "It works."),
    ("Say ' [X]' now [MASK] .", " It works."),
  ],
)
def test_boundary_merge_falls_back_to_sentence_alone(roberta_tokenizer, text, alone):
  # "It works.'" ends in RoBERTa's single token ".'" in context.
  template, batch = encode(roberta_tokenizer, text, ["It works."])
  sentence_ids = roberta_tokenizer(alone, add_special_tokens=False)["input_ids"]
  assert len(batch.input_ids[0]) == template.num_tokens + len(sentence_ids)
  np.testing.assert_array_equal(batch.input_ids[0], template.row(sentence_ids))
  assert batch.input_ids[0].tolist() != filled_ids(roberta_tokenizer, text, "It works.")
  assert roberta_tokenizer.convert_ids_to_tokens(sentence_ids)[-1] == "."


def test_no_fallback_when_space_separates(roberta_tokenizer):
  text = ROBERTA_TEMPLATES[0]
  _, batch = encode(roberta_tokenizer, text, ["It works."])
  assert batch.input_ids[0].tolist() == filled_ids(roberta_tokenizer, text, "It works.")


def test_pad_to(bert_tokenizer):
  template, batch = encode(bert_tokenizer, COT_BERT, SENTENCES[:3], pad_to=64)
  _, natural = encode(bert_tokenizer, COT_BERT, SENTENCES[:3])
  width = natural.input_ids.shape[1]
  assert batch.input_ids.shape == (3, 64)
  np.testing.assert_array_equal(batch.input_ids[:, :width], natural.input_ids)
  assert np.all(batch.input_ids[:, width:] == template.pad_id)
  np.testing.assert_array_equal(batch.attention_mask.sum(1), natural.attention_mask.sum(1))
  with pytest.raises(ValueError, match="Sentence 1 .*pad_to"):
    templates.tokenize_sentences(template, bert_tokenizer, ["a", LONG], pad_to=width - 1)


def test_too_long_row_raises_naming_sentence(bert_tokenizer):
  template = templates.Template.parse(COT_BERT, bert_tokenizer)
  very_long = " ".join(["word"] * 600)
  with pytest.raises(ValueError, match="Sentence 1 .*max_sentence_tokens"):
    templates.tokenize_sentences(template, bert_tokenizer, ["a", very_long])
  with pytest.raises(ValueError, match="Sentence 0 .*limit 20"):
    templates.tokenize_sentences(template, bert_tokenizer, ["a b c d e"], max_length=20)
  batch = templates.tokenize_sentences(template, bert_tokenizer, [very_long], max_sentence_tokens=32)
  assert batch.input_ids.shape == (1, template.num_tokens + 32)


def test_bad_sentences_raise(bert_tokenizer):
  template = templates.Template.parse(COT_BERT, bert_tokenizer)
  with pytest.raises(TypeError, match="Sentence 1 is not a str but int"):
    templates.tokenize_sentences(template, bert_tokenizer, ["a", 3])
  with pytest.raises(TypeError, match="not one str"):
    templates.tokenize_sentences(template, bert_tokenizer, "a sentence")
  with pytest.raises(ValueError, match="No sentences"):
    templates.tokenize_sentences(template, bert_tokenizer, [])


def test_alone_tokenization_is_the_authors_prepare_features(bert_tokenizer, roberta_tokenizer):
  """kongds/Prompt-BERT `train.py` `prepare_features`: encode(prefix)[:-1] + encode(s, add_special_tokens=False)[:n]
  + encode(suffix)[1:], the prefix stripped for RoBERTa. For BERT that is the in-context row; for RoBERTa the
  sentence's first word loses its leading space."""
  sentences = ["A man plays a guitar.", "Two dogs run in the snow and the wind over the hills"]
  for tokenizer, text, bs, es in (
    (bert_tokenizer, 'This sentence of "[X]" means[MASK].', ' This sentence of "', '" means[MASK].'),
    (roberta_tokenizer, "This sentence : ' [X] ' means[MASK].", "This sentence : '", " ' means<mask>."),
  ):
    template = templates.Template.parse(text, tokenizer)
    batch = templates.tokenize_sentences(template, tokenizer, sentences, max_sentence_tokens=8, tokenization="alone")
    for row, mask, length, sentence in zip(batch.input_ids, batch.attention_mask, batch.sentence_lengths, sentences):
      expected = (
        tokenizer.encode(bs)[:-1] + tokenizer.encode(sentence, add_special_tokens=False)[:8] + tokenizer.encode(es)[1:]
      )
      assert row[mask == 1].tolist() == expected and length == min(8, len(tokenizer.tokenize(sentence)))
    in_context = templates.tokenize_sentences(template, tokenizer, sentences, max_sentence_tokens=8)
    same = np.array_equal(in_context.input_ids, batch.input_ids)
    assert same == (tokenizer is bert_tokenizer)
  first = roberta_tokenizer.convert_ids_to_tokens(batch.input_ids[0, 1 + len(template.prefix_ids)].item())
  assert first == "A"  # Not "ĠA", as in the filled-in string.
  # Alone, a sentence is tokenised as it is: SimCSE's NLI lines end in spaces, RoBERTa `Ġ` tokens in the authors'
  # rows; in context jaxemb strips them (evaluation.py strips the filled-in string).
  spaced = templates.tokenize_sentences(template, roberta_tokenizer, ["It is left.  "], tokenization="alone")
  assert spaced.sentence_lengths[0] == len(roberta_tokenizer.encode("It is left.  ", add_special_tokens=False)) == 6
  stripped = templates.tokenize_sentences(template, roberta_tokenizer, ["It is left.  "])
  assert stripped.sentence_lengths[0] == 4
  with pytest.raises(ValueError, match="tokenization 'whole' is not one of"):
    templates.tokenize_sentences(template, roberta_tokenizer, sentences, tokenization="whole")


def test_cot_roberta_training_template_ends_in_a_space_token(roberta_tokenizer):
  """ZBWpro/CoT-BERT `code-for-RoBERTa/train.py`: "..._as_*mask*_._*sep+*" leaves a space before </s>, a `Ġ` token
  in every training and [PAD] row; its evaluation.py strips the filled-in string, so evaluation has none."""
  from configs import cotroberta  # pylint: disable=g-import-not-at-top

  config = cotroberta.get_config()
  suffix = " ' means <mask> , so it can be summarized as <mask> . "
  for text in config.objective.templates:
    template = templates.Template.parse(text, roberta_tokenizer)
    assert roberta_tokenizer.convert_ids_to_tokens(list(template.suffix_ids))[-2:] == ["Ġ.", "Ġ"]
  anchor = templates.Template.parse(config.objective.templates[0], roberta_tokenizer)
  assert list(anchor.prefix_ids) == roberta_tokenizer.encode("The sentence of '")[1:-1]
  assert list(anchor.suffix_ids) == roberta_tokenizer.encode(suffix)[1:-1]
  evaluation = templates.Template.parse(config.method.template, roberta_tokenizer)
  assert evaluation.suffix_ids == anchor.suffix_ids[:-1]
