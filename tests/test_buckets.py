"""jaxemb.buckets: the widths an encoder call's batches run at, against every plan tried by brute force."""

import itertools
import types

import numpy as np
import pytest

from jaxemb import buckets


def _cost(plan, needed, batch_flops, compile_flops):
  """A plan's cost as merged_widths defines it: each batch at its width, each width compiled once."""
  assert all(plan >= needed)
  return sum(batch_flops(w) for w in plan) + compile_flops * len(set(plan.tolist()))


def _brute_force(needed, batch_flops, compile_flops):
  """The least cost over every set of the needed widths that covers the batches."""
  candidates = sorted(set(needed.tolist()))
  best = np.inf
  for size in range(1, len(candidates) + 1):
    for chosen in itertools.combinations(candidates, size):
      if max(chosen) < needed.max():
        continue
      chosen = np.array(chosen)
      plan = chosen[np.searchsorted(chosen, needed)]
      best = min(best, _cost(plan, needed, batch_flops, compile_flops))
  return best


@pytest.mark.parametrize("seed", range(40))
def test_the_plan_costs_the_least_of_every_set_of_widths(seed):
  rng = np.random.default_rng(seed)
  needed = np.sort(rng.choice(np.arange(8, 80, 4), size=rng.integers(1, 12)))
  compile_flops = float(rng.choice([0.0, 50.0, 400.0, 5000.0]))
  batch_flops = lambda w: 64 * (w + w * w / 50)
  plan = buckets.merged_widths(needed, batch_flops, compile_flops)
  assert plan.shape == needed.shape
  assert _cost(plan, needed, batch_flops, compile_flops) == pytest.approx(
    _brute_force(needed, batch_flops, compile_flops), rel=1e-12
  )


def test_free_compiles_keep_each_width_and_dear_ones_merge_all_into_the_longest():
  needed = np.array([8, 8, 12, 16, 40])
  bert_base = types.SimpleNamespace(hidden_size=768, intermediate_size=3072, num_hidden_layers=12)
  flops = lambda w: 64 * buckets.row_flops(bert_base, w)
  np.testing.assert_array_equal(buckets.merged_widths(needed, flops, 0.0), needed)
  np.testing.assert_array_equal(buckets.merged_widths(needed, flops, 1e15), [40] * 5)


def test_row_flops_counts_the_projections_and_attention():
  config = types.SimpleNamespace(hidden_size=8, intermediate_size=32, num_hidden_layers=2)
  # Per layer: 2 x 5 tokens x (4 x 64 + 2 x 8 x 32) and 4 x 25 x 8.
  assert buckets.row_flops(config, 5) == 2 * (2 * 5 * (256 + 512) + 4 * 25 * 8)
