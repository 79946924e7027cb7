r"""Attention at the encoder's shapes: `jax.nn.dot_product_attention` as the encoder calls it (no `implementation`:
XLA's own attention on every backend, GPUs included) against cuDNN's fused kernel (`implementation="cudnn"`, a GPU's,
bfloat16 or float16 only), given the [PAD] keys as the encoder's boolean mask and as key lengths. Prints each case's
microseconds a call and its speed against XLA's, and how far its output is from XLA's. Where cuDNN's kernel cannot run
(the CPU, float32) its rows say why. Issue 52, item 3 (docs/accelerators.md: why the encoder does not ask for it).

  python bench/attention.py                            # bert-base's heads (12 x 64), batch 256, widths 32, 64, 144
  python bench/attention.py --heads 12 --head_dim 32   # MiniLM's
"""

import argparse
import functools

import common  # Before jax: its environment settings.  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import numpy as np

# (name, implementation, how the [PAD] keys are given): the encoder's call first, the reference of the others.
CASES = (
  ("xla, mask (the encoder's)", None, "mask"),
  ("cudnn, mask", "cudnn", "mask"),
  ("cudnn, key lengths", "cudnn", "lengths"),
)


def attention(implementation, pads, q, k, v, lengths):
  keys = jnp.arange(k.shape[1])[None, :] < lengths[:, None]
  if pads == "mask":
    return jax.nn.dot_product_attention(q, k, v, mask=keys[:, None, None, :], implementation=implementation)
  return jax.nn.dot_product_attention(q, k, v, key_value_seq_lengths=lengths, implementation=implementation)


def inputs(batch: int, width: int, heads: int, head_dim: int, dtype):
  """Random queries, keys and values [batch, width, heads, head_dim] and each row's unpadded length (half its
  width to all of it, as the encoder's length buckets hold)."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((batch, width, heads, head_dim)), dtype) for _ in range(3))
  lengths = jnp.asarray(rng.integers(width // 2, width + 1, batch), jnp.int32)
  return q, k, v, lengths


def width_rows(args, width: int) -> list[str]:
  """The table's rows of one width."""
  operands = inputs(args.batch, width, args.heads, args.head_dim, jnp.dtype(args.dtype))
  runs, outputs, rows = {}, {}, {}
  for name, implementation, pads in CASES:
    fn = jax.jit(functools.partial(attention, implementation, pads))
    try:
      outputs[name] = np.asarray(fn(*operands), np.float32)
    except Exception as e:  # pylint: disable=broad-except  # Why cuDNN's kernel cannot run here: one line.
      rows[name] = f"| {width} | {name} | not run: {str(e).splitlines()[0][:100]} | | |"
      continue
    runs[name] = lambda fn=fn: [fn(*operands) for _ in range(args.calls)][-1].block_until_ready()
  seconds = common.interleaved(runs, args.repeats)
  reference = CASES[0][0]
  for name, took in seconds.items():
    speed = common.ratio(seconds[reference], took)
    gap = np.abs(outputs[name] - outputs[reference]).max()
    rows[name] = f"| {width} | {name} | {took / args.calls * 1e6:,.1f} | {speed} | {gap:.1e} |"
  return [rows[name] for name, _, _ in CASES]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--widths", default="32,64,144", help="Tokens a row (comma-separated).")
  parser.add_argument("--heads", type=int, default=12)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="bfloat16")
  parser.add_argument("--calls", type=int, default=20, help="Calls a timed sample.")
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; batch {args.batch}, {args.heads} heads of ", end="")
  print(f"{args.head_dim}, {args.dtype}; medians of {args.repeats} samples of {args.calls} calls")
  print("| width | attention | us a call | speed vs XLA's | max abs difference from XLA's |")
  print("|---|---|---|---|---|")
  for width in map(int, args.widths.split(",")):
    print("\n".join(width_rows(args, width)))


if __name__ == "__main__":
  main()
