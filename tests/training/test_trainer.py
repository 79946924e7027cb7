"""jaxemb/training/trainer.py: a call of the jitted steps."""

import jax
import numpy as np

from jaxemb import sharding
from jaxemb.data import corpus
from jaxemb.models import load_pretrained, load_tokenizer
from jaxemb.training import loop, trainer
from jaxemb.spec import TrainingRun
from tests.support import tiny_config


def test_how_the_steps_are_split_into_calls_changes_no_bit(tiny_bert, wiki_head, tmp_path):
  """Three steps (dropout on, three batches) in one call, in calls of 1 and 2, and one a call end with the same
  losses and params to the bit: one program runs them all, each step drawing its masks from its own step number. And
  they are `train_step`'s steps: one a call without the loop (steps_per_call 1) gives the same losses and updates
  to float rounding."""
  config = tiny_config("promptbert", tiny_bert, tmp_path, wiki_head, adam_eps=1e-6)
  tokenizer = load_tokenizer(tiny_bert)
  model_config, pretrained = load_pretrained(tiny_bert)
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, tokenizer)
  built = trainer.build_trainer(run, model_config, pretrained, objective, sharding.make_mesh(-1, 1), 10)
  assert built.steps_per_call == 4  # The CPU's default: a call of 3 leaves one slot unread.
  lines = loop.read_columns(run)["text"]
  batches = [
    {
      trainer.batch_field("text", t.text): corpus.tokenize_cached(
        lines[4 * i : 4 * i + 4], t, tokenizer, 16, tmp_path / "cache", config.data.tokenization
      )
      for t in built.objective.view_templates
    }
    for i in range(3)
  ]
  start = jax.device_get(built.initial_state(pretrained).params)

  def run(split):
    state, losses, left = built.initial_state(pretrained), [], iter(batches)
    for count in split:
      state, metrics = built.run(state, [next(left) for _ in range(count)])
      losses.extend(np.asarray(metrics["loss"])[:count])
    return losses, jax.device_get(state.params)

  losses, params = run([3])
  for split in ([1, 2], [1, 1, 1]):
    other_losses, other_params = run(split)
    np.testing.assert_array_equal(other_losses, losses, err_msg=str(split))
    jax.tree.map(np.testing.assert_array_equal, other_params, params)

  config.train.steps_per_call = 1  # The accelerators' default: `train_step` alone, no loop around it.
  single = trainer.build_trainer(
    TrainingRun.from_config(config), model_config, pretrained, objective, sharding.make_mesh(-1, 1), 10
  )
  state, alone = single.initial_state(pretrained), []
  for batch in batches:
    state, metrics = single.step(state, batch)
    alone.append(float(metrics["loss"]))
  np.testing.assert_allclose(alone, losses, rtol=1e-5)
  lr = config.train.learning_rate
  jax.tree.map(
    lambda a, b, s: np.testing.assert_allclose(a - s, b - s, rtol=1e-3, atol=1e-2 * lr),
    jax.device_get(state.params),
    params,
    start,
  )
