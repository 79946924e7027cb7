"""Each DEFAULT training config against a PyTorch transcription of the authors' step (reference_torch.py): five steps
on a tiny dropout-free model, comparing the losses and every parameter's update of every step; and the model
selection vectors against the authors' trainer (`sentemb_forward` + its SentEval batcher).

The configs run as they are but for the model, the batch (8 rows; CoT's two replicas of 4, the supervised runs' four
DDP ranks of 2) and a larger learning rate (2e-4), so an update is ~2e-4 and its float32 value (param after - before)
keeps about 4 significant digits. Negative controls show the comparison fails with optax's AdamW or without clipping.
"""

import importlib

import jax
import numpy as np
import pytest
import scipy.stats
import torch

from jaxemb import sharding, templates
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder
from jaxemb.evaluation import common
from jaxemb.models import hf, load_pretrained, load_tokenizer
from jaxemb.training import selection, trainer
from jaxemb.training import state as train_state
from jaxemb.testing.checkpoints import write_random_checkpoint
from jaxemb.spec import TrainingRun
from tests.support import shared_path
from testing_support import reference_torch as ref

STEPS, SCHEDULE, LR, ROWS = 5, 10, 2e-4, 8

# jaxemb config -> the authors' setting it reproduces (reference_torch.SETTINGS).
SETTINGS = {
  "promptbert": "unsup-bert",
  "promptroberta": "unsup-roberta",
  "promptbert_sup": "sup-bert",
  "promptroberta_sup": "sup-roberta",
  "cotbert": "cot-bert",
  "cotroberta": "cot-roberta",
  "simcse": "simcse-unsup",
  "simcse_sup": "simcse-sup",
  "optiprompt": "bert-optiprompt",
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  # Position tables long enough for the authors' 50 (training) and 128 (selection) offset rows.
  return {
    family: write_random_checkpoint(
      tmp_path_factory.mktemp(f"reference-{family}"),
      family,
      hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0,
      max_position_embeddings=192 + (2 if family == "roberta" else 0),
    )
    for family in ("bert", "roberta")
  }


@pytest.fixture(scope="module")
def torch_threads():
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  yield
  torch.set_num_threads(threads)


def examples(supervised: bool):
  """The first ROWS training examples of the shared samples: wiki lines, or NLI (sent0, sent1, hard_neg)."""
  if supervised:
    lines = shared_path("data", "nli", "nli_for_simcse_sample.csv").read_text(encoding="utf-8").splitlines()
    import csv  # pylint: disable=g-import-not-at-top

    rows = list(csv.reader(lines))[1:]
    return [tuple(r) for r in rows[:ROWS]]
  lines = shared_path("data", "wiki", "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()
  return [line for line in lines if line.strip()][:ROWS]


def default_config(name, model_dir, **changes):
  config = importlib.import_module(f"configs.{name}").get_config()
  config.model.path = str(model_dir)
  config.train.batch_size = ROWS
  config.train.learning_rate = LR
  config.model.scan_unroll = 1  # The CPU's default unrolls the layers: faster steps, slower compiles.
  # The accelerators' path (views stacked in one call); tests/training/test_encoder_calls.py holds it equal to the
  # CPU's call per part with dropout on.
  config.model.stack_encoder_calls = True
  if config.objective.loss_group_size:  # CoT's two DataParallel replicas.
    config.objective.loss_group_size = ROWS // 2
  for key, value in changes.items():
    section, field = key.split(".")
    config[section][field] = value
  return config


def jaxemb_run(config, model_dir, rows):
  """STEPS jaxemb steps on one repeated batch: (losses, per-step updates of all params, initial params)."""
  tokenizer = load_tokenizer(model_dir)
  model_config, pretrained = load_pretrained(model_dir)
  columns = (
    {c: [r[i] for r in rows] for i, c in enumerate(("sent0", "sent1", "hard_neg"))}
    if config.data.format == "nli"
    else {"text": rows}
  )
  width = config.data.max_sentence_tokens
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, tokenizer)
  built = trainer.build_trainer(run, model_config, pretrained, objective, sharding.make_mesh(-1, 1), SCHEDULE)
  batch = {
    trainer.batch_field(c, t.text): templates.tokenize_sentences(
      t,
      tokenizer,
      columns[c],
      max_sentence_tokens=width,
      pad_to=t.num_tokens + width,
      tokenization=config.data.tokenization,
    )
    for c, t in zip(config.objective.columns, built.objective.view_templates)
  }
  state, step = built.initial_state(pretrained), built.step
  initial = jax.device_get(state.all_params)
  losses, updates, before = [], [], initial
  for _ in range(STEPS):
    state, metrics = step(state, batch)
    after = jax.device_get(state.all_params)
    losses.append(float(metrics["loss"]))
    updates.append(jax.tree.map(lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64), after, before))
    before = after
  return losses, updates, initial, model_config


def torch_names(tree, config, family):
  """A jaxemb params-shaped tree as {authors' parameter name: array}: the encoder under "bert."/"roberta.", the
  MLM transform (--org_mlp) as "mlp.", the fresh MLP as "mlp.dense", OptiPrompt's vectors as "p_mbv" (without the
  [MASK] row, which the authors' p_mbv does not have)."""
  state, _ = hf.params_to_state_dict(tree["encoder"], config)
  named = {}
  for key, value in state.items():
    key = key.removeprefix(f"{family}.")
    if key.startswith("cls.predictions.transform."):
      named["mlp." + key.removeprefix("cls.predictions.transform.")] = value
    elif not key.startswith(("cls.", "lm_head.")):  # The MLM decoder: no reference counterpart.
      named[f"{family}.{key}"] = value
  if "mlp" in tree:
    named["mlp.dense.weight"] = np.asarray(tree["mlp"]["dense"]["kernel"]).T
    named["mlp.dense.bias"] = np.asarray(tree["mlp"]["dense"]["bias"])
  if "prompt" in tree:
    named["p_mbv"] = np.asarray(tree["prompt"])
  return named


def without_mask_row(prompt, template):
  ids = template.prefix_ids + template.suffix_ids
  return prompt[[i for i, token in enumerate(ids) if token != template.mask_id]]


# (setting, model, rows, ddp world size, init) -> the reference's RunResult. The negative controls change the jaxemb
# side only: their reference runs are those of the default steps, run once.
_REFERENCE_RUNS = {}


def reference_run(setting_name, model_dir, rows, tokenizer, init, ddp_world_size):
  """ref.run_steps for STEPS steps of SCHEDULE at LR, run once per distinct input."""
  key = (
    setting_name,
    str(model_dir),
    tuple(rows),
    ddp_world_size,
    tuple((k, np.asarray(v).tobytes()) for k, v in sorted(init.items())),
  )
  if key not in _REFERENCE_RUNS:
    _REFERENCE_RUNS[key] = ref.run_steps(
      ref.get_setting(setting_name),
      model_dir,
      [rows],
      STEPS,
      SCHEDULE,
      LR,
      tokenizer=tokenizer,
      init=init,
      ddp_world_size=ddp_world_size,
    )
  return _REFERENCE_RUNS[key]


def compare_runs(name, models, **changes):
  """(jaxemb's losses and named updates, the reference's) for config `name` with `changes`."""
  family = "roberta" if "roberta" in name else "bert"
  setting = ref.get_setting(SETTINGS[name])
  config = default_config(name, models[family], **changes)
  rows = examples(setting.supervised)
  losses, updates, initial, model_config = jaxemb_run(config, models[family], rows)
  tokenizer = load_tokenizer(models[family])
  init = {}
  if "mlp" in initial:  # The same fresh MLP on both sides.
    init = {k: v for k, v in torch_names(initial, model_config, family).items() if k.startswith("mlp.dense")}
  if "prompt" in initial:
    template = templates.Template.parse(config.objective.templates[0], tokenizer)
    initial = {**initial, "prompt": without_mask_row(initial["prompt"], template)}
    updates = [{**u, "prompt": without_mask_row(u["prompt"], template)} for u in updates]
  result = reference_run(SETTINGS[name], models[family], rows, tokenizer, init, config.objective.ddp_world_size)
  ours = [torch_names(u, model_config, family) for u in updates]
  return losses, ours, result


def assert_same_updates(ours, result):
  """Every parameter's update of every step against the reference's.

  float32 gradients (jaxemb's and torch's alike) are off from a float64 computation by up to ~1e-5 of the largest
  gradient of their tensor (measured on these models), and a tensor whose true gradient is zero (attention key
  biases) holds rounding only. Where a gradient is resolved, over 1e-2 of its tensor's largest and 1e-4 of the
  step's largest, its float32 value holds 3 digits, and so does its update (whose relative change is at most the
  gradient's): rtol 2e-3 + 1e-3 lr. Elsewhere Adam's lr sqrt(1 - b2)/(1 - b1) m / (sqrt(v) + eps) turns rounding
  into up to ~0.3 lr for gradients near zero, so those updates are bounded at 0.5 lr of each other. A parameter
  one side has and the other does not must not move.
  """
  for step, (a, b, grads) in enumerate(zip(ours, result.updates, result.grads)):
    largest = max(np.abs(g).max() for g in grads.values())
    for name in sorted(set(a) | set(b)):
      if name not in a or name not in b:
        only = a.get(name, b.get(name))
        assert np.abs(only).max() == 0, f"step {step}: {name} moves on one side only"
        continue
      resolved = np.abs(grads[name]) > max(1e-2 * np.abs(grads[name]).max(), 1e-4 * largest)
      np.testing.assert_allclose(
        a[name][resolved],
        b[name][resolved],
        rtol=2e-3,
        atol=1e-3 * LR,
        err_msg=f"step {step}: {name}, resolved gradients",
      )
      np.testing.assert_allclose(a[name], b[name], rtol=0, atol=0.5 * LR, err_msg=f"step {step}: {name}")


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_five_default_steps_equal_the_authors_step(name, models, torch_threads):
  losses, ours, result = compare_runs(name, models)
  np.testing.assert_allclose(losses, result.losses, rtol=2e-5, atol=1e-6)
  assert losses[-1] < losses[0]
  assert_same_updates(ours, result)
  moved = [n for n, u in ours[0].items() if np.abs(u).max() > 0]
  assert moved  # The trained params move...
  if name == "optiprompt":  # ... and for OptiPrompt only the vectors and the MLM transform.
    assert all(n == "p_mbv" or n.startswith("mlp.") for n in moved), moved


@pytest.mark.parametrize("name", ["promptbert", "simcse", "cotbert"])
def test_the_unrolled_layers_step_equals_the_authors_step(name, models, torch_threads):
  """The layers unrolled (the CPU's and GPUs' default, which the other tests leave for the loop's cheaper compile),
  where the last layer computes only the rows read (the [MASK] of the sentence rows and of the position-offset or
  [PAD] bias rows; [CLS]): the same comparison."""
  losses, ours, result = compare_runs(name, models, **{"model.scan_unroll": None})
  np.testing.assert_allclose(losses, result.losses, rtol=2e-5, atol=1e-6)
  assert_same_updates(ours, result)


@pytest.mark.parametrize(
  "change", [{"train.optimizer": "optax_adamw"}, {"train.max_grad_norm": 0.0}, {"objective.bias_positions": "model"}]
)
def test_the_comparison_fails_with_a_different_step(change, models, torch_threads):
  """Negative controls: optax's AdamW, no clipping, or RoBERTa's HF bias positions each give other updates.

  Without clipping PromptBERT's losses move apart from the second step (1e-4, then 2e-2 of the loss: the comparison
  allows 2e-5) and its updates by up to 0.53 lr (allowed: 0.5 lr, and 2e-3 of a resolved gradient's)."""
  name = "promptbert" if "train.max_grad_norm" in change else "promptroberta"  # PromptBERT's gradient norm: 11 -> 1.2.
  losses, ours, result = compare_runs(name, models, **change)
  if "train.max_grad_norm" in change:
    assert max(result.grad_norms) > 1.0  # Clipping is active in the reference run.
  with pytest.raises(AssertionError):
    np.testing.assert_allclose(losses, result.losses, rtol=2e-5, atol=1e-6)
    assert_same_updates(ours, result)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_selection_vectors_equal_the_authors_trainer(name, models, torch_threads):
  """STS-B dev sentences through jaxemb's selection method equal the authors' `sentemb_forward` on their batcher's
  rows, with the same initial weights (the fresh MLP included), and so does the dev Spearman."""
  family = "roberta" if "roberta" in name else "bert"
  config = default_config(name, models[family])
  tokenizer = load_tokenizer(models[family])
  model_config, pretrained = load_pretrained(models[family])
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, tokenizer)
  built = trainer.build_trainer(run, model_config, pretrained, objective, sharding.make_mesh(-1, 1), SCHEDULE)
  objective = built.objective
  params, frozen = built.initial_params(pretrained)
  params = train_state.merge_params(frozen, params)
  encoder = Encoder(
    model_config,
    selection.eval_params(TrainingRun.from_config(config), params),
    tokenizer,
    selection.selection_method(TrainingRun.from_config(config), objective),
    prompt=params.get("prompt"),
    length_multiple=128,
  )  # One compiled shape.
  dev = sts_data.load_sts_task(shared_path("data", "senteval"), "STSBenchmark", "dev")
  pairs = [
    (a, b, g) for subset in dev.subsets.values() for a, b, g in zip(subset.sentences1, subset.sentences2, subset.scores)
  ][:48]
  preprocess = common.preprocess(join_tokens=True, add_period=False)
  sentences = [preprocess(s) for pair in pairs for s in pair[:2]]
  reference = ref.ReferenceModel(ref.get_setting(SETTINGS[name]), models[family], tokenizer=tokenizer)
  init = torch_names(params, model_config, family)
  if "prompt" in params:
    template = templates.Template.parse(config.objective.templates[0], tokenizer)
    init = {**init, "p_mbv": without_mask_row(np.asarray(params["prompt"]), template)}
  named = dict(reference.named_parameters())
  with torch.no_grad():
    for key in ("mlp.dense.weight", "mlp.dense.bias", "p_mbv"):
      if key in named and key in init:
        named[key].copy_(torch.as_tensor(np.array(init[key])))
  ours = encoder.encode(sentences, batch_size=16)
  theirs = reference.embed(sentences)
  np.testing.assert_allclose(ours, theirs, atol=2e-5, rtol=1e-4)
  cosine = lambda v: np.sum(v[0::2] * v[1::2], -1) / np.linalg.norm(v[0::2], axis=-1) / np.linalg.norm(v[1::2], axis=-1)
  spearman = lambda v: scipy.stats.spearmanr(cosine(v), [p[2] for p in pairs])[0]
  np.testing.assert_allclose(spearman(ours), spearman(theirs), atol=1e-6)
