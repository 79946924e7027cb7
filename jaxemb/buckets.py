"""The widths an encoder call's length buckets run at (jaxemb.encode.Encoder): each batch at its longest row's padded
width, or, where compiling a shape costs more than the padding that spares it, merged into fewer, wider shapes.

The trade is the device's (jaxemb.xla.compile_flops): on the CPU, where a shape compiles in ~1 s and MiniLM encodes
~8,000 tokens a second, merging the 7 STS tasks' 13 widths into 9 runs as fast and keeps fewer programs in memory
(docs/benchmarks.md); on a GPU a shape's compile and autotuning (~5 s on an H200: 11 shapes in a 56-59 s cold
evaluation) outweighs the encoding of every STS sentence at the longest width."""

from collections.abc import Callable

import numpy as np


def row_flops(config, width: int) -> float:
  """Matmul FLOPs of one row of `width` tokens through a `config` encoder (EncoderConfig): per layer the projections
  (query, key, value, output and the two feed-forward ones: 2 width (4 h^2 + 2 h ffn)) and attention's two batched
  products (4 width^2 h)."""
  h, ffn = config.hidden_size, config.intermediate_size
  return config.num_hidden_layers * (2 * width * (4 * h * h + 2 * h * ffn) + 4 * width * width * h)


def merged_widths(needed: np.ndarray, batch_flops: Callable[[int], float], compile_flops: float) -> np.ndarray:
  """The width each batch runs at, given `needed`, each batch's own (its longest row's padded width; the batches all
  of one row count): the plan of least cost, a batch at width w costing `batch_flops(w)` and each width
  `compile_flops` once, where a batch may run at any width at least its own. With `compile_flops` 0 that is each
  batch's own width. The plan is the call's alone, not what earlier calls compiled: a batch's padding, and so the bits
  of its vectors, depend on the call's sentences only (embed.py's resumed job writes the shards an uninterrupted one
  does). A dynamic programme over the needed widths in increasing order, each the widest of the batches since the last
  one chosen (O(widths^2))."""
  needed = np.asarray(needed, np.int64)
  if not len(needed) or compile_flops <= 0:
    return needed
  candidates = sorted(set(needed.tolist()))
  counts = np.array([np.sum(needed == w) for w in candidates])
  best, previous = [0.0] * len(candidates), [-1] * len(candidates)
  for j, width in enumerate(candidates):
    options = [
      ((best[i] if i >= 0 else 0.0) + counts[i + 1 : j + 1].sum() * batch_flops(width) + compile_flops, i)
      for i in range(-1, j)
    ]
    best[j], previous[j] = min(options)
  last = min((j for j, w in enumerate(candidates) if w >= needed.max()), key=lambda j: best[j])
  chosen = []
  while last >= 0:
    chosen.append(candidates[last])
    last = previous[last]
  chosen = np.array(sorted(chosen))
  return chosen[np.searchsorted(chosen, needed)]
