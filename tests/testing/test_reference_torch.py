"""Self-checks of the PyTorch transcription of the authors' code (testing_support/reference_torch.py) alone.

No jaxemb code here: these pin the transcription to the authors' behaviour (input rows, bias-table rows,
OptiPrompt placement, transformers-4.2 AdamW, clipping, schedule, DataParallel grouping) so that tests
comparing jaxemb against it compare against the right thing.
"""

import csv

import numpy as np
import pytest
import torch
import transformers

from jaxemb.testing.checkpoints import write_random_checkpoint
from tests.support import shared_path
from testing_support import reference_torch as R

# Dropout 0 so a step is deterministic; 192 positions so the dev bias table (128 offset rows) fits.
TINY = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, max_position_embeddings=192)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
  """Tiny CPU models: intra-op threads only add contention (20x slower on a busy 2-core machine)."""
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return {f: write_random_checkpoint(tmp_path_factory.mktemp(f"reference-{f}"), f, **TINY) for f in ("bert", "roberta")}


@pytest.fixture(scope="module")
def wiki():
  with open(shared_path("data", "wiki", "wiki1m_sample.txt"), encoding="utf-8") as f:
    return [line.strip() for line in f if line.strip()][:8]


@pytest.fixture(scope="module")
def nli():
  with open(shared_path("data", "nli", "nli_for_simcse_sample.csv"), encoding="utf-8") as f:
    return [tuple(row) for row in list(csv.reader(f))[1:9]]


@pytest.fixture(scope="module")
def stsb_dev():
  return R.read_stsb(shared_path("data", "senteval", "STS", "STSBenchmark", "sts-dev.csv"))


def tokens(tokenizer, ids):
  return tokenizer.convert_ids_to_tokens([int(i) for i in ids])


# ---------------------------------------------------------------------------------------------------------
# (a) input construction


def test_bert_rows_are_the_filled_in_templates(bert_tokenizer):
  sentences = ["A man is playing a guitar.", "Two dogs run"]
  batch = R.prepare_features("unsup-bert", bert_tokenizer, sentences)
  assert batch["input_ids"].shape[:2] == (2, 2)
  sent = bert_tokenizer.tokenize(sentences[0])
  row_of = tokens(bert_tokenizer, batch["input_ids"][0, 0])
  row_colon = tokens(bert_tokenizer, batch["input_ids"][0, 1])
  assert row_of == ["[CLS]", "this", "sentence", "of", '"', *sent, '"', "means", "[MASK]", ".", "[SEP]"]
  assert row_colon == ["[CLS]", "this", "sentence", ":", '"', *sent, '"', "means", "[MASK]", ".", "[SEP]"]
  # For BERT, the token-level construction equals tokenising the whole filled-in string.
  assert batch["input_ids"][0, 0].tolist() == bert_tokenizer.encode(f'This sentence of "{sentences[0]}" means[MASK].')
  # The shorter example is right-padded with [PAD] to the batch's longest row, attention 0 there.
  short = bert_tokenizer.encode(f'This sentence of "{sentences[1]}" means[MASK].')
  assert batch["input_ids"][1, 0, : len(short)].tolist() == short
  assert batch["attention_mask"][1, 0].tolist() == [1] * len(short) + [0] * (batch["input_ids"].shape[-1] - len(short))
  assert set(batch["input_ids"][1, 0, len(short) :].tolist()) == {bert_tokenizer.pad_token_id}


def test_sentence_truncated_to_max_seq_length_template_kept(bert_tokenizer):
  long = " ".join(["word"] * 50)
  row = R.prepare_features("unsup-bert", bert_tokenizer, [long])["input_ids"][0, 0].tolist()
  assert len(row) == 32 + 10 and row.count(bert_tokenizer.mask_token_id) == 1


def test_roberta_rows_sentence_starts_without_space_marker(roberta_tokenizer):
  sentence = "A man is playing a guitar."
  batch = R.prepare_features("unsup-roberta", roberta_tokenizer, [sentence])
  own = roberta_tokenizer.tokenize(sentence)  # the sentence tokenised alone: 'A', not 'ĠA'
  assert own[0] == "A"
  assert tokens(roberta_tokenizer, batch["input_ids"][0, 0]) == [
    "<s>",
    "This",
    "Ġsentence",
    "Ġ:",
    "Ġ'",
    *own,
    "Ġ'",
    "Ġmeans",
    "<mask>",
    ".",
    "</s>",
  ]
  assert tokens(roberta_tokenizer, batch["input_ids"][0, 1]) == [
    "<s>",
    "The",
    "Ġsentence",
    "Ġ:",
    "Ġ'",
    *own,
    "Ġ'",
    "Ġmeans",
    "<mask>",
    ".",
    "</s>",
  ]
  # Tokenising the whole string would give the first word its 'Ġ': the training rows differ from that.
  whole = roberta_tokenizer.encode(f"This sentence : ' {sentence} ' means<mask>.")
  assert batch["input_ids"][0, 0].tolist() != whole and "ĠA" in tokens(roberta_tokenizer, whole)


def test_template_token_lists(bert_tokenizer, roberta_tokenizer):
  """The token lists train.py derives, as the report quotes them."""

  def lists(name, tokenizer):
    views = R.setting_templates(R.get_setting(name), tokenizer)
    return [(tokens(tokenizer, v.prefix), tokens(tokenizer, v.suffix)) for v in views]

  assert lists("sup-bert", bert_tokenizer) == [
    (["[CLS]", "this", "sentence", "of", '"'], ['"', "means", "[MASK]", ".", "[SEP]"])
  ]
  assert lists("bert-optiprompt", bert_tokenizer) == [
    (["[CLS]", "this", "sentence", ":", '"'], ['"', "means", "[MASK]", ".", "[SEP]"])
  ]
  assert lists("sup-roberta", roberta_tokenizer) == [
    (["<s>", "This", "Ġsentence", "Ġ:", "Ġ'"], ["Ġ'", "Ġmeans", "<mask>", ".", "</s>"])
  ]
  tail = ["Ġ,", "Ġso", "Ġit", "Ġcan", "Ġbe", "Ġsummarized", "Ġas", "<mask>", "Ġ.", "Ġ", "</s>"]
  cot_r = lists("cot-roberta", roberta_tokenizer)
  assert cot_r[0] == (["<s>", "The", "Ġsentence", "Ġof", "Ġ'"], ["Ġ'", "Ġmeans", "<mask>", *tail])
  assert cot_r[1] == (["<s>", "The", "Ġsentence", "Ġ:", "Ġ'"], ["Ġ'", "Ġmeans", "<mask>", *tail])
  assert cot_r[2][1] == [
    "Ġ'",
    "Ġdoes",
    "Ġnot",
    "Ġmean",
    "<mask>",
    "Ġ,",
    "Ġso",
    "Ġit",
    "Ġcannot",
    "Ġbe",
    "Ġsummarized",
    "Ġas",
    "<mask>",
    "Ġ.",
    "Ġ",
    "</s>",
  ]
  cot_b = lists("cot-bert", bert_tokenizer)
  assert cot_b[0] == (
    ["[CLS]", "the", "sentence", "of", '"'],
    ['"', "means", "[MASK]", ",", "so", "it", "can", "be", "summarized", "as", "[MASK]", ".", "[SEP]"],
  )
  # The CoT-RoBERTa template (bs + es tokenised as one string) keeps the trailing 'Ġ' too.
  anchor = R.setting_templates(R.get_setting("cot-roberta"), roberta_tokenizer)[0]
  assert tokens(roberta_tokenizer, anchor.template)[-3:] == ["Ġ.", "Ġ", "</s>"]


def test_nli_rows_use_view_templates(bert_tokenizer, nli):
  batch = R.prepare_features("sup-bert", bert_tokenizer, nli[:2])
  assert batch["input_ids"].shape[:2] == (2, 3)
  for k in range(3):
    expected = bert_tokenizer.encode(f'This sentence of "{nli[1][k]}" means[MASK].')
    expected = expected[:5] + bert_tokenizer.encode(nli[1][k], add_special_tokens=False)[:32] + expected[-5:]
    assert batch["input_ids"][1, k, : len(expected)].tolist() == expected


def test_cot_rows_anchor_positive_negative(bert_tokenizer):
  batch = R.prepare_features("cot-bert", bert_tokenizer, ["it rains"])
  rows = [tokens(bert_tokenizer, batch["input_ids"][0, k][batch["attention_mask"][0, k] == 1]) for k in range(3)]
  assert rows[0][:7] == ["[CLS]", "the", "sentence", "of", '"', "it", "rains"]
  assert rows[1][:7] == ["[CLS]", "the", "sentence", ":", '"', "it", "rains"]
  assert rows[2][7:11] == ['"', "does", "not", "mean"]


def test_simcse_rows_truncate_to_32_with_specials(bert_tokenizer):
  batch = R.prepare_features("simcse-unsup", bert_tokenizer, [" ".join(["word"] * 50), "short one"])
  assert batch["input_ids"].shape == (2, 2, 32)
  assert batch["input_ids"][0, 0, -1] == bert_tokenizer.sep_token_id
  assert (batch["input_ids"][:, 0] == batch["input_ids"][:, 1]).all()  # the same sentence twice


def test_position_offset_rows(bert_tokenizer):
  view = R.setting_templates(R.get_setting("unsup-bert"), bert_tokenizer)[0]
  ids, pos = R.position_offset_rows(view.template, len(view.bs), 50)
  assert ids.shape == pos.shape == (50, 10) and (ids == torch.tensor(view.template)).all()
  assert tokens(bert_tokenizer, ids[0]) == [
    "[CLS]",
    "this",
    "sentence",
    "of",
    '"',
    '"',
    "means",
    "[MASK]",
    ".",
    "[SEP]",
  ]
  # Row n: [CLS] + bs at 0..4, then the closing quote onwards shifted by n, as if n tokens filled the slot.
  assert pos[0].tolist() == list(range(10))
  assert pos[7].tolist() == [0, 1, 2, 3, 4] + [5 + 7 + j for j in range(5)]
  assert pos[49, -1] == 9 + 49


def test_cot_pad_rows(bert_tokenizer, roberta_tokenizer):
  view = R.setting_templates(R.get_setting("cot-bert"), bert_tokenizer)[0]
  ids, mask = R.pad_denoise_rows(view.template, view.bs, view.es, bert_tokenizer.pad_token_id)
  n_template = len(view.template)
  assert ids.shape == mask.shape == (80 - n_template + 1, 80)
  row = tokens(bert_tokenizer, ids[3])
  assert row[:8] == ["[CLS]", "the", "sentence", "of", '"', "[PAD]", "[PAD]", "[PAD]"]
  assert row[8 : 8 + len(view.es) + 1] == tokens(bert_tokenizer, view.es) + ["[SEP]"]
  assert mask[3].tolist() == [1] * (n_template + 3) + [0] * (80 - n_template - 3)
  assert (ids[0, :n_template] == torch.tensor(view.template)).all()
  # RoBERTa: HF's own positions skip the slot <pad>s (they get padding_idx 1), so es does not move with i.
  rview = R.setting_templates(R.get_setting("cot-roberta"), roberta_tokenizer)[0]
  rids, _ = R.pad_denoise_rows(rview.template, rview.bs, rview.es, roberta_tokenizer.pad_token_id)
  pos = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(rids, 1)
  es_at = 1 + len(rview.bs)
  assert pos[0, es_at].item() == pos[5, es_at + 5].item() == 2 + es_at
  assert pos[5, es_at : es_at + 5].tolist() == [1] * 5


def test_dev_insertion_equals_training_view_1(bert_tokenizer, roberta_tokenizer):
  """The trainer's batcher + sentemb_forward insertion gives view 1's training row (no '.' appended)."""
  for name, tok in (("unsup-bert", bert_tokenizer), ("unsup-roberta", roberta_tokenizer)):
    sentences = ["a man is playing a guitar", "two dogs run in the snow ."]
    enc = tok(sentences, return_tensors="pt", padding=True)
    view = R.setting_templates(R.get_setting(name), tok)[0]
    inserted = R.insert_template(enc["input_ids"], view.bs, view.es, tok.pad_token_id)
    train = R.prepare_features(name, tok, sentences)["input_ids"][:, 0]
    for k in range(2):
      real = inserted[k][inserted[k] != tok.pad_token_id]
      assert real.tolist() == train[k][train[k] != tok.pad_token_id].tolist()


# ---------------------------------------------------------------------------------------------------------
# (c) the optimizer step


def test_adamw_first_step_matches_hand_computation_and_not_optax():
  optax = pytest.importorskip("optax")
  import jax.numpy as jnp

  lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
  g = torch.tensor([1e-9, -3e-8, 0.5, -2.0], dtype=torch.float32)
  p = nn_param(torch.zeros(4))
  p.grad = g.clone()
  R.AdamW42([("w", p)]).step(lr)
  g64 = g.double().numpy()
  hand = -lr * np.sqrt(1 - b2) / (1 - b1) * g64 * (1 - b1) / (np.sqrt((1 - b2) * g64**2) + eps)
  np.testing.assert_allclose(p.detach().double().numpy(), hand, rtol=1e-5, atol=0)
  opt = optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=0.0)
  params = jnp.zeros(4)
  upd, _ = opt.update(jnp.asarray(g.numpy()), opt.init(params), params)
  upd = np.asarray(upd, np.float64)
  np.testing.assert_allclose(upd[2:], hand[2:], rtol=1e-4)  # large gradients: the same step, -lr sign(g)
  # Tiny gradients: HF's eps acts as eps / sqrt(1 - b2) (~32x larger), so its step is far smaller.
  assert np.all(np.abs(hand[:2]) < 0.2 * np.abs(upd[:2]))


def test_adamw_second_step_and_decoupled_decay():
  lr, wd = 1e-2, 0.1
  w = nn_param(torch.tensor([1.0, -1.0]))
  bias = nn_param(torch.tensor([1.0]))
  opt = R.AdamW42([("layer.weight", w), ("layer.bias", bias)], weight_decay=wd)
  m = v = 0.0
  w_expected = b_expected = 1.0
  for t, g in enumerate([0.3, -0.1], start=1):
    w.grad, bias.grad = torch.tensor([g, -g]), torch.tensor([g])
    opt.step(lr)
    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    adam = lr * np.sqrt(1 - 0.999**t) / (1 - 0.9**t) * m / (np.sqrt(v) + 1e-8)
    w_expected = (w_expected - adam) * (1 - lr * wd)  # decay after the Adam step, on the updated value
    b_expected -= adam  # 'bias' is never decayed
  np.testing.assert_allclose(w.detach().numpy()[0], w_expected, rtol=1e-6)
  np.testing.assert_allclose(bias.detach().numpy()[0], b_expected, rtol=1e-6)
  assert R.no_decay("layer.bias") and R.no_decay("encoder.LayerNorm.weight") and not R.no_decay("mlp.dense.weight")


def test_adamw_skips_params_without_grad():
  p = nn_param(torch.ones(3))
  R.AdamW42([("p", p)]).step(1.0)
  assert (p.detach() == 1).all()


def test_clip_scales_to_norm_one():
  a, b = nn_param(torch.zeros(2)), nn_param(torch.zeros(1))
  a.grad, b.grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
  assert R.clip_grad_norm([a, b, nn_param(torch.zeros(1))], 1.0) == pytest.approx(5.0)
  np.testing.assert_allclose(torch.cat([a.grad, b.grad]).numpy(), np.array([3, 0, 4]) / (5 + 1e-6), rtol=1e-6)
  a.grad, b.grad = torch.tensor([0.3, 0.0]), torch.tensor([0.4])
  R.clip_grad_norm([a, b], 1.0)
  assert torch.cat([a.grad, b.grad]).tolist() == pytest.approx([0.3, 0.0, 0.4])  # below 1: untouched


def test_linear_schedule():
  assert [R.linear_lr(1e-5, t, 4) for t in range(5)] == pytest.approx([1e-5, 7.5e-6, 5e-6, 2.5e-6, 0.0])


def nn_param(x):
  return torch.nn.Parameter(x.clone().float())


# ---------------------------------------------------------------------------------------------------------
# OptiPrompt placement


def test_optiprompt_placement(checkpoints, bert_tokenizer):
  model = R.ReferenceModel("bert-optiprompt", checkpoints["bert"])
  assert tokens(bert_tokenizer, model.dict_mbv) == ["this", "sentence", ":", '"', '"', "means", "."]
  assert model.fl_mbv == [True, True, True, True, False, False, False]
  assert not any(p.requires_grad for p in model.bert.parameters())
  ids = model.prepare(["I read this sentence twice."])["input_ids"][:, 0]
  row = tokens(bert_tokenizer, ids[0])
  assert row[:5] == ["[CLS]", "this", "sentence", ":", '"']
  pos = R.prompt_vector_positions(ids, model.dict_mbv, model.fl_mbv)[0].tolist()
  closing = len(row) - 5
  assert row[closing] == '"' and pos[3] == pos[4] == closing  # both quote vectors on the closing quote
  assert pos[0] == row.index("this", 1 + 1) and pos[1] == row.index("sentence", 2 + 1)  # the sentence's copies
  assert pos[2] == 3 and row[pos[5]] == "means" and pos[6] == len(row) - 2
  with torch.no_grad():  # make each vector distinguishable from the static embeddings it starts from
    model.p_mbv.copy_(torch.arange(1, 8, dtype=torch.float32).unsqueeze(-1).expand_as(model.p_mbv))
    embeds = model._embed_with_prompt(ids)[0]
  static = model.bert.embeddings.word_embeddings.weight
  assert torch.equal(embeds[4], static[ids[0, 4]])  # the opening quote keeps its static embedding
  assert (embeds[closing] == 5).all()  # the later quote vector (index 4) wins
  assert torch.equal(embeds[1], static[ids[0, 1]]) and (embeds[pos[0]] == 1).all()  # template 'this' static


def test_optiprompt_step_trains_prompt_and_head_only(checkpoints, wiki):
  result = R.run_steps("bert-optiprompt", checkpoints["bert"], [wiki[:4]], 1, 10, 1e-3)
  assert sorted(result.updates[0]) == [
    "mlp.LayerNorm.bias",
    "mlp.LayerNorm.weight",
    "mlp.dense.bias",
    "mlp.dense.weight",
    "p_mbv",
  ]
  p_update = result.updates[0]["p_mbv"]
  assert not p_update[3].any() and p_update[4].any()  # the opening-quote vector is never used
  assert all(np.abs(p_update[i]).sum() > 0 for i in (0, 1, 2, 5, 6))


# ---------------------------------------------------------------------------------------------------------
# (b) + (c) + (d): every setting


@pytest.mark.parametrize("name", sorted(R.SETTINGS))
def test_five_steps_and_dev_score(name, checkpoints, wiki, nli, stsb_dev):
  setting = R.get_setting(name, max_seq_length=16)
  if setting.codebase == "cot_bert":  # shorter [PAD] tables (the 80-long rows are checked above): CPU time
    setting = R.get_setting(setting, total_length=40)
  data = nli if setting.supervised else wiki
  batches = [data[:4], data[4:8]]
  result = R.run_steps(setting, checkpoints[setting.family], batches, 5, 5, 1e-4)
  losses = np.array(result.losses)
  assert np.isfinite(losses).all() and len(set(np.round(losses, 6))) > 1
  assert len(result.updates) == 5 and result.lrs == pytest.approx([1e-4 * (5 - t) / 5 for t in range(5)])
  # The last step's lr is 1e-4 / 5 and every step is clipped: no update is larger than a few lr.
  for update in result.updates:
    assert all(np.isfinite(u).all() and np.abs(u).max() < 1e-3 for u in update.values())
  assert np.abs(result.updates[0]["mlp.dense.weight"]).max() > 0
  vectors = result.model.embed([s1 for s1, _, _ in stsb_dev[:6]])
  assert vectors.shape == (6, 32) and vectors.dtype == np.float32 and np.isfinite(vectors).all()
  assert np.isfinite(R.sts_spearman(result.model, stsb_dev[:16]))


def test_padding_rows_get_no_update(checkpoints, wiki):
  """HF's nn.Embedding padding_idx rows get no gradient, so AdamW leaves them exactly in place."""
  cot = R.run_steps(
    R.get_setting("cot-bert", max_seq_length=16, total_length=40), checkpoints["bert"], [wiki[:4]], 1, 10, 1e-3
  )
  words = cot.updates[-1]["bert.embeddings.word_embeddings.weight"]
  assert not words[0].any() and words[1996].any()  # [PAD] (attended in the [PAD] rows) vs 'the'
  unsup = R.run_steps(
    R.get_setting("unsup-roberta", max_seq_length=16), checkpoints["roberta"], [wiki[:4]], 1, 10, 1e-3
  )
  positions = unsup.updates[-1]["roberta.embeddings.position_embeddings.weight"]
  # Row 1 is padding_idx, used by the delta rows' second token; row 0 only the delta rows use.
  assert not positions[1].any() and positions[0].any() and positions[2].any()


def test_cot_groups_are_independent_losses(checkpoints, wiki):
  """DataParallel over 2: each half its own tables and negatives, the two losses averaged."""
  model = R.ReferenceModel(R.get_setting("cot-bert", max_seq_length=16, total_length=40), checkpoints["bert"])
  batch = model.prepare(wiki[:6])
  with torch.no_grad():
    grouped = model.loss(batch)
    halves = [
      model._info_nce(model.representations(batch["input_ids"][s], batch["attention_mask"][s]))
      for s in (slice(0, 3), slice(3, 6))
    ]
    whole = model._info_nce(model.representations(batch["input_ids"], batch["attention_mask"]))
  assert grouped.item() == pytest.approx((halves[0].item() + halves[1].item()) / 2, rel=1e-6)
  assert abs(grouped.item() - whole.item()) > 1e-4


def test_heads_at_dev(checkpoints):
  """sentemb_forward's heads: sup-bert T(h) - T(b); sup-roberta mlp(h - b); unsup no head."""
  sentences = ["a man is playing a guitar", "a dog runs"]
  for name, head in (("sup-bert", "transform"), ("sup-roberta", "mlp"), ("unsup-bert", None)):
    model = R.ReferenceModel(name, checkpoints[R.SETTINGS[name].family])
    model.eval()
    view = model.views[0]
    enc = model.tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
      ids = R.insert_template(enc["input_ids"], view.bs, view.es, model.pad_token_id)
      mask = (ids != model.pad_token_id).long()
      h = model._hidden(ids, attention_mask=mask)[ids == model.mask_token_id]
      b = model.position_bias(view, 128)[mask.sum(-1) - len(view.template)]
      expected = {"transform": model.mlp(h) - model.mlp(b), "mlp": model.mlp(h - b), None: h - b}[head]
    np.testing.assert_allclose(model.embed(sentences), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_sts_spearman_and_reader(stsb_dev):
  assert len(stsb_dev) == 1500 and stsb_dev[0] == (
    "a man with a hard hat is dancing .",
    "a man wearing a hard hat is dancing .",
    5.0,
  )

  class Angles:
    """Embeds sentence i at angle gold_i: cosine falls as gold rises."""

    def __init__(self, pairs):
      self.angle = {s1: 0.0 for s1, _, _ in pairs} | {s2: 1.5 - 0.3 * g for _, s2, g in pairs}

    def embed(self, sentences, batch_size=128):
      a = np.array([self.angle[s] for s in sentences], np.float32)
      return np.stack([np.cos(a), np.sin(a)], -1)

  pairs = [(f"x{i}", f"y{i}", float(g)) for i, g in enumerate([0.5, 4.0, 2.0, 3.0, 1.0])]
  assert R.sts_spearman(Angles(pairs), pairs) == pytest.approx(100.0)
