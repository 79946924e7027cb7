"""MLM pre-training: the masking against HF's collator, the loss and the tied / untied checkpoints against HF
PyTorch's BertForMaskedLM, a falling loss, and the errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxemb import sharding, templates
from jaxemb.errors import ConfigError
from jaxemb.models import EncoderConfig, Transformer, hf
from jaxemb.training import mlm, objectives, trainer
from jaxemb.spec import TrainingRun
from tests.support import assert_float32_close, cross_entropy_atol, float32_atol, shared_path, transformer_roundings

TINY = EncoderConfig(
  model_type="bert",
  vocab_size=30522,
  hidden_size=32,
  num_hidden_layers=2,
  num_attention_heads=4,
  intermediate_size=64,
  max_position_embeddings=64,
  hidden_dropout_prob=0.0,
  attention_probs_dropout_prob=0.0,
)


def _rows(bert_tokenizer, batch, width, seed=0):
  """Sentences of random ids and lengths in the "[X]" template: [CLS] sentence [SEP] [PAD]..."""
  rng = np.random.default_rng(seed)
  template = templates.Template.parse("[X]", bert_tokenizer)
  lengths = rng.integers(1, width - 1, batch)
  ids = np.zeros((batch, width), np.int32)
  for i, n in enumerate(lengths):
    ids[i, : n + 2] = [template.cls_id, *rng.integers(1000, 30000, n), template.sep_id]
  rows = templates.TemplateBatch(
    jnp.asarray(ids),
    jnp.asarray((ids != 0).astype(np.int32)),
    jnp.zeros((batch, 0), jnp.int32),
    jnp.asarray(lengths, jnp.int32),
  )
  return template, rows


def _shares(original, corrupted, selected, mask_id=103):
  """([MASK], random, kept shares of the selected tokens) of one masking."""
  masked = corrupted == mask_id
  kept = corrupted == original
  n = selected.sum()
  return np.array([(masked & selected).sum() / n, (~masked & ~kept & selected).sum() / n, (kept & selected).sum() / n])


def test_masking_statistics_are_bert_s_and_hf_collator_s(bert_tokenizer):
  """15% of the sentence tokens, of which 80% [MASK], 10% random, 10% kept, as HF's DataCollatorForLanguageModeling
  draws on the same rows; [CLS], [SEP] and padding are never selected nor changed."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  template, rows = _rows(bert_tokenizer, 1024, 48)
  original = np.asarray(rows.input_ids)
  maskable = np.asarray(mlm.maskable(rows, template))
  assert maskable.sum() == np.asarray(rows.sentence_lengths).sum()
  ids, selected = jax.jit(mlm.mask_tokens, static_argnums=(3, 4))(
    jax.random.key(0), rows.input_ids, jnp.asarray(maskable), 103, 30522
  )
  ids, selected = np.asarray(ids), np.asarray(selected)
  assert not (selected & ~maskable).any() and (ids[~maskable] == original[~maskable]).all()
  collator = transformers.DataCollatorForLanguageModeling(bert_tokenizer, mlm_probability=0.15, seed=0)
  hf_ids, labels = collator.torch_mask_tokens(torch.tensor(original, dtype=torch.long), torch.tensor(~maskable))
  hf_ids, hf_selected = hf_ids.numpy(), labels.numpy() != -100
  ours, theirs = _shares(original, ids, selected), _shares(original, hf_ids, hf_selected)
  # ~26k maskable tokens (std of the 15% share 0.002), ~3.9k selected (std of the 80% share 0.006).
  assert abs(selected.sum() / maskable.sum() - 0.15) < 0.01 and abs(hf_selected.sum() / maskable.sum() - 0.15) < 0.01
  np.testing.assert_allclose(ours, [0.8, 0.1, 0.1], atol=0.03)
  np.testing.assert_allclose(ours, theirs, atol=0.04)


def _words(tokenizer, sentence_ids):
  """Each token's word index in one sentence, from its piece's text: a word begins at the first token and at every
  WordPiece piece without "##" (BERT) or byte-level piece with "Ġ" (RoBERTa)."""
  tokens = tokenizer.convert_ids_to_tokens(sentence_ids)
  roberta = tokenizer.convert_ids_to_tokens([tokenizer.cls_token_id])[0] == "<s>"
  begins = [i == 0 or (t.startswith("\u0120") if roberta else not t.startswith("##")) for i, t in enumerate(tokens)]
  return np.cumsum(begins) - 1


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_whole_word_masking_selects_whole_words_at_bert_s_rate(family, bert_tokenizer, roberta_tokenizer):
  """Whole words of the sentences only (never a part of one, nor [CLS], [SEP], template tokens or padding), 15% of
  them, each token then replaced 80/10/10; a sentence's first word too, whose RoBERTa piece has no "Ġ"."""
  from configs import train_common  # pylint: disable=g-import-not-at-top

  tokenizer = bert_tokenizer if family == "bert" else roberta_tokenizer
  text = train_common.PROMPTBERT_OF if family == "bert" else train_common.PROMPTROBERTA_THIS
  template = templates.Template.parse(text, tokenizer)
  sentences = shared_path("data", "wiki", "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()[:1024]
  rows = templates.tokenize_sentences(template, tokenizer, sentences, max_sentence_tokens=32, tokenization="alone")
  maskable = mlm.maskable(rows, template)
  ids, selected = jax.jit(mlm.mask_tokens, static_argnums=(3, 4, 5))(
    jax.random.key(0),
    rows.input_ids,
    maskable,
    template.mask_id,
    len(tokenizer),
    mlm.WordStarts.from_tokenizer(tokenizer),
  )
  original, ids, selected = np.asarray(rows.input_ids), np.asarray(ids), np.asarray(selected)
  assert not (selected & ~np.asarray(maskable)).any() and (ids[~selected] == original[~selected]).all()
  start = 1 + len(template.prefix_ids)
  chosen, pieces, first_words = [], [], 0
  for row, length in enumerate(np.asarray(rows.sentence_lengths)):
    words = _words(tokenizer, original[row, start : start + length].tolist())
    picked = selected[row, start : start + length]
    for word in range(words[-1] + 1 if length else 0):
      of_word = picked[words == word]
      assert of_word.all() or not of_word.any(), (row, word)  # Never a part of a word.
      chosen.append(of_word[0])
      pieces.append(len(of_word))
    first_words += bool(length and picked[0])
  chosen, pieces = np.array(chosen), np.array(pieces)
  # ~24k words: the std of the 15% share is 0.0023.
  assert abs(chosen.mean() - mlm.SELECT_RATE) < 0.01, chosen.mean()
  assert chosen[pieces > 1].sum() > 100 and 100 < first_words < 220  # Words of several pieces; 15% of 1024 first words.
  np.testing.assert_allclose(_shares(original, ids, selected, template.mask_id), [0.8, 0.1, 0.1], atol=0.03)


def test_whole_word_masking_needs_word_boundaries_and_the_mlm_loss(bert_tokenizer):
  import tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  # A word-level vocabulary: no piece marks where a word begins.
  words = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
  )
  with pytest.raises(
    ConfigError,
    match=r"^objective.whole_word_mask: the vocabulary of \w+ gives no word starts: "
    r"it is neither WordPiece",
  ):
    mlm.WordStarts.from_tokenizer(words)
  table = mlm.WordStarts.from_tokenizer(bert_tokenizer).table
  assert table.shape == (30522,) and table[bert_tokenizer.convert_tokens_to_ids("the")]
  assert not table[bert_tokenizer.convert_tokens_to_ids("##s")]
  with pytest.raises(ConfigError, match="whole-word masking applies to loss 'mlm' only"):
    dataclasses.replace(
      _mlm_objective(bert_tokenizer),
      views=("a", "b"),
      view_templates=(_mlm_objective(bert_tokenizer).view_templates * 2),
      loss="info_nce",
      word_starts=mlm.WordStarts(b"", 0),
    )


def test_init_params_are_hf_s_initialisation():
  params = hf.init_params(dataclasses.replace(TINY, tie_word_embeddings=False), 0.02)
  assert params["mlm_head"]["decoder"].shape == (32, 30522) and "pooler" in params
  np.testing.assert_array_equal(params["layer_0"]["ffn_norm"]["scale"], 1)
  np.testing.assert_array_equal(params["mlm_head"]["bias"], 0)
  np.testing.assert_array_equal(params["embeddings"]["word"]["embedding"][0], 0)  # [PAD], HF's padding_idx.
  assert abs(float(params["mlm_head"]["decoder"].std()) - 0.02) < 1e-3
  assert abs(float(params["layer_1"]["query"]["kernel"].std()) - 0.02) < 2e-3


def _mlm_objective(bert_tokenizer):
  return objectives.Objective(
    views=("text|[X]",),
    view_templates=(templates.Template.parse("[X]", bert_tokenizer),),
    pooling="cls",
    denoise="none",
    head="none",
    loss="mlm",
    temperature=0.05,
  )


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def trained(request, tmp_path_factory):
  """(tokenizer, a tiny BERT from scratch after 8 MLM steps on one repeated batch, their losses, its saved HF
  directory), tied or untied."""
  from configs import pretrain_mlm  # pylint: disable=g-import-not-at-top

  tokenizer = hf.load_tokenizer(shared_path("tokenizers", "bert-base-uncased"))
  config = pretrain_mlm.get_config("tied" if request.param else "untied")
  config.train.learning_rate = 3e-3
  config.train.max_grad_norm = 0.0
  model_config = dataclasses.replace(TINY, tie_word_embeddings=request.param)
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, tokenizer)
  built = trainer.build_trainer(
    run,
    model_config,
    hf.init_params(model_config),
    objective,
    sharding.make_mesh(-1, 1),
    100,
  )
  _, rows = _rows(tokenizer, 32, 24)
  state = built.initial_state(hf.init_params(model_config))
  losses = []
  for _ in range(8):
    state, metrics = built.step(state, {"text|[X]": rows})
    losses.append(float(metrics["loss"]))
  out = tmp_path_factory.mktemp("mlm-hf")
  hf.save_pretrained(out, model_config, state.all_params["encoder"], tokenizer)
  return tokenizer, losses, out


def test_loss_starts_at_log_vocab_and_falls(trained):
  _, losses, _ = trained
  assert abs(losses[0] - np.log(30522)) < 0.1  # HF's init: near-uniform predictions.
  assert losses[-1] < losses[0] - 0.25, losses


def test_saved_checkpoint_gives_hf_bert_for_masked_lm_s_logits_and_loss(trained):
  """A trained checkpoint, tied or untied, loads in HF PyTorch BertForMaskedLM whole and gives its logits, and
  masked_lm_loss is HF's loss (cross-entropy over the labelled positions) on a masked batch."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top

  tokenizer, _, out = trained
  torch_model, info = transformers.BertForMaskedLM.from_pretrained(out, output_loading_info=True)
  # BertForMaskedLM has no pooler; the checkpoint keeps it, as the original BERT checkpoints do.
  assert not info["missing_keys"]
  assert set(info["unexpected_keys"]) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias"}
  config, params = hf.load_pretrained(out)
  tied = config.tie_word_embeddings
  assert torch_model.config.tie_word_embeddings == tied
  decoder, words = torch_model.cls.predictions.decoder.weight, torch_model.bert.embeddings.word_embeddings.weight
  assert (decoder.data_ptr() == words.data_ptr()) == tied
  template, rows = _rows(tokenizer, 4, 16, seed=1)
  ids, selected = mlm.mask_tokens(jax.random.key(3), rows.input_ids, mlm.maskable(rows, template), 103, 30522)
  model = Transformer(config)
  ours = model.apply({"params": params}, ids, rows.attention_mask, output_mlm_logits=True).mlm_logits
  labels = np.where(np.asarray(selected), np.asarray(rows.input_ids), -100)
  with torch.no_grad():
    theirs = torch_model(
      input_ids=torch.tensor(np.asarray(ids), dtype=torch.long),
      attention_mask=torch.tensor(np.asarray(rows.attention_mask)),
      labels=torch.tensor(labels, dtype=torch.long),
    )
  # Both float32, each its own kernels: the forward and the MLM head (tests/support.py); the loss then moves by at
  # most 2 min(1, loss) times the logits' tolerance, and rounds its log-sum-exp over the vocabulary and its mean.
  roundings = transformer_roundings(config, rows.input_ids.shape[1], mlm_head=True)
  assert_float32_close(np.asarray(ours), theirs.logits.numpy(), roundings)
  hidden = model.apply({"params": params}, ids, rows.attention_mask).last_hidden_state
  logits = lambda h: model.apply({"params": params}, h, method=Transformer.mlm_logits)
  loss, _ = mlm.masked_lm_loss(logits, hidden, rows.input_ids, selected)
  scale = np.abs(theirs.logits.numpy()).max()
  atol = cross_entropy_atol(
    theirs.loss, float32_atol(scale, roundings), config.vocab_size + selected.size + 4, logit_scale=scale
  )
  np.testing.assert_allclose(float(loss), float(theirs.loss), rtol=0, atol=atol)


def test_mlm_objective_refuses_a_head_and_a_checkpoint_without_mlm_head(bert_tokenizer):
  objective = _mlm_objective(bert_tokenizer)
  with pytest.raises(ConfigError, match="needs head 'none'"):
    dataclasses.replace(objective, head="mlp")
  _, rows = _rows(bert_tokenizer, 2, 8)
  params = {"encoder": {k: v for k, v in hf.init_params(TINY).items() if k != "mlm_head"}}
  with pytest.raises(ConfigError, match="needs a checkpoint with an MLM head"):
    objectives.loss_and_metrics(objective, Transformer(TINY), params, {"text|[X]": rows}, jax.random.key(0))


def test_loss_decodes_at_most_its_slots_and_counts_only_selected_tokens():
  """More selected tokens than prediction_slots (vanishingly rare at 15%): the loss is the mean over the first
  slots; none selected: 0, not NaN."""
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(2, 64, 8)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 8, (2, 64)), jnp.int32)
  logits = lambda h: h  # Hidden 8 = a vocabulary of 8.
  slots = mlm.prediction_slots(128)
  assert slots == 55
  loss, _ = mlm.masked_lm_loss(logits, hidden, targets, jnp.ones((2, 64), bool))
  flat, labels = hidden.reshape(-1, 8)[:slots], targets.reshape(-1)[:slots]
  expected = -jax.nn.log_softmax(flat)[jnp.arange(slots), labels].mean()
  # The same float32 logits: the two computations' own log-sum-exp over 8 and mean over the slots apart.
  atol = cross_entropy_atol(expected, 0.0, 8 + 4 + slots, logit_scale=np.abs(flat).max())
  np.testing.assert_allclose(float(loss), float(expected), rtol=0, atol=atol)
  loss, accuracy = mlm.masked_lm_loss(logits, hidden, targets, jnp.zeros((2, 64), bool))
  assert float(loss) == 0 and float(accuracy) == 0
