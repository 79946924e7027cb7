"""Compile time, program size and run time of a bert-base-size encoder, its layers scanned (`nn.scan` over stacked
params) or unrolled (one module per layer), at 12 and 24 layers, forward alone and forward + gradient.

No weights are read: the programs are lowered from the params' shapes (`jax.eval_shape` of the init) and compiled
for this machine. Compile time is `lower` + `compile`, wall clock, best of `--repeats`; HLO size is the characters of
the lowered StableHLO text and of the compiled (optimised) HLO module; run time is one call of the compiled program
on zero params (best of `--repeats`). Other processes sharing the machine slow both sides alike: compare the ratios
of one run.

  python bench/scan_layers.py [--layers 12 24] [--batch 8] [--length 32] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import common  # pylint: disable=unused-import  (puts the repository on the path)
import jax
import jax.numpy as jnp

from jaxemb import xla  # pylint: disable=g-bad-import-order
from jaxemb.models import EncoderConfig, Transformer


def bert_base(num_layers: int) -> EncoderConfig:
  return EncoderConfig(
    "bert",
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=num_layers,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
  )


def program(model: Transformer, gradient: bool):
  """Forward: the last states' sum of squares; with `gradient`, its value and gradients (dropout on, as training)."""

  def loss(params, ids, mask, rng):
    out = model.apply({"params": params}, ids, mask, deterministic=not gradient, rngs={"dropout": rng})
    return jnp.sum(out.last_hidden_state**2)

  return jax.value_and_grad(loss) if gradient else loss


def measure(
  config: EncoderConfig, scan_layers: bool, gradient: bool, batch: int, length: int, repeats: int
) -> dict[str, float]:
  """{compile_s, lowered_chars, compiled_chars, run_s} of one program."""
  model = Transformer(config, scan_layers=scan_layers)
  ids = jax.ShapeDtypeStruct((batch, length), jnp.int32)
  params = jax.eval_shape(
    lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32))["params"]
  )
  args = (params, ids, ids, jax.eval_shape(lambda: jax.random.key(0)))
  best = float("inf")
  for _ in range(repeats):
    jax.clear_caches()
    start = time.perf_counter()
    lowered = xla.jit(program(model, gradient)).lower(*args)
    compiled = lowered.compile()
    best = min(best, time.perf_counter() - start)
  concrete = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), args[:3]) + (jax.random.key(0),)
  run = float("inf")
  for _ in range(repeats + 1):  # The first call also allocates.
    start = time.perf_counter()
    jax.block_until_ready(compiled(*concrete))
    run = min(run, time.perf_counter() - start)
  return {
    "compile_s": best,
    "lowered_chars": len(lowered.as_text()),
    "compiled_chars": len(compiled.as_text() or ""),
    "run_s": run,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--layers", type=int, nargs="+", default=[12, 24])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--length", type=int, default=32)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  common.print_load("start")  # The CPU model beside every number.
  print(f"{jax.devices()[0].device_kind}, batch {args.batch} x length {args.length}, best of {args.repeats}")
  print(
    f"{'layers':>6} {'program':>8} {'layout':>9} {'compile s':>10} {'lowered chars':>14} {'compiled chars':>15} "
    f"{'run s':>7}"
  )
  for num_layers in args.layers:
    for gradient in (False, True):
      name = "fwd+grad" if gradient else "forward"
      results = {}
      for scan_layers in (False, True):
        layout = "scanned" if scan_layers else "unrolled"
        r = results[layout] = measure(
          bert_base(num_layers), scan_layers, gradient, args.batch, args.length, args.repeats
        )
        print(
          f"{num_layers:>6} {name:>8} {layout:>9} {r['compile_s']:>10.2f} {r['lowered_chars']:>14,} "
          f"{r['compiled_chars']:>15,} {r['run_s']:>7.3f}",
          flush=True,
        )
      ratio = lambda key: results["unrolled"][key] / results["scanned"][key]
      print(
        f"{num_layers:>6} {name:>8} {'unrolled/scanned':>16} {ratio('compile_s'):>6.2f}x compile, "
        f"{ratio('lowered_chars'):.1f}x lowered, {ratio('compiled_chars'):.1f}x compiled, "
        f"{ratio('run_s'):.2f}x run",
        flush=True,
      )


if __name__ == "__main__":
  main()
