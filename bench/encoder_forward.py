r"""Encoder forward throughput: jaxemb against HF PyTorch on the same weights and inputs, and the share of this
machine's matmul peak that each reaches.

For each model and batch x length it times the jitted jaxemb forward (last hidden state) and HF `BertModel` (no
pooler, torch.inference_mode) alternately, with a large matmul in jax and in torch in the same rotation; the higher
matmul rate is the peak. The jax functions are compiled as jaxemb.encode compiles the encoder (`jaxemb.xla.jit`
with the compute dtype's CPU options: oneDNN's dots for float32 on x86, YNNPACK's for bfloat16, whose dots return
float32); --compare adds the forward compiled with other options (XLA's defaults; Eigen's dots, jaxemb's float32
choice until 2026-11-24). --dtype bfloat16 runs jaxemb in bfloat16 and PyTorch under CPU autocast. Forward FLOPs
are counted analytically (`jaxemb.buckets.row_flops`). The bert-base-sized checkpoint is random, written with HF
transformers into a temporary folder and read by `jaxemb.models.load_pretrained`, so both sides run the same
weights.

  python bench/encoder_forward.py                                 # bert-base-sized and MiniLM, 4 shapes each
  python bench/encoder_forward.py --models bert-base --shapes 64x64 --repeats 9
  python bench/encoder_forward.py --dtype bfloat16 --compare eigen     # against torch's CPU autocast
"""

import argparse
import pathlib
import tempfile

import common
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from jaxemb import buckets, xla  # pylint: disable=g-bad-import-order
from jaxemb.models import Transformer, load_pretrained


# Other compiler options --compare times the jaxemb forward with: XLA's defaults and jaxemb's previous float32 choice.
OTHER_OPTIONS = {"defaults": {}, "eigen": xla.EIGEN_DOTS}


def matmul_cases(n: int, dtype: str) -> tuple[dict, float]:
  """({"jax matmul", "torch matmul"} callables, FLOPs) of one [n, n] x [n, n] product in `dtype`, each side's
  dot as its forward runs it (jax's returning `xla.dot_output_dtype`)."""
  a, b = np.random.default_rng(0).standard_normal((2, n, n), np.float32)
  ja, jb = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
  ta, tb = torch.from_numpy(a).to(getattr(torch, dtype)), torch.from_numpy(b).to(getattr(torch, dtype))
  product = xla.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=xla.dot_output_dtype(dtype)), dtype)
  return {"jax matmul": lambda: product(ja, jb).block_until_ready(), "torch matmul": lambda: ta @ tb}, 2.0 * n**3


def forward_cases(config, params, torch_model, batch: int, length: int, dtype: str, compare: list[str]) -> dict:
  """{"jaxemb", "pytorch", *compare}: one forward pass of the same random full-length batch in `dtype` (torch's
  under CPU autocast for bfloat16)."""
  ids = np.random.default_rng(1).integers(1000, config.vocab_size, (batch, length), dtype=np.int32)
  mask = np.ones_like(ids)
  model = Transformer(config, dtype=dtype)  # As jaxemb.encode's: the dots this backend takes for the dtype.
  apply = lambda p, i, m: model.apply({"params": p}, i, m).last_hidden_state
  jax_inputs = (jnp.asarray(ids), jnp.asarray(mask))
  forwards = {"jaxemb": xla.jit(apply, dtype)}  # As jaxemb.encode compiles it.
  forwards.update({name: jax.jit(apply, compiler_options=OTHER_OPTIONS[name]) for name in compare})
  torch_inputs = dict(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long())
  autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")

  def pytorch():
    with torch.inference_mode(), autocast:
      return torch_model(**torch_inputs).last_hidden_state

  return {
    **{name: lambda f=f: f(params, *jax_inputs).block_until_ready() for name, f in forwards.items()},
    "pytorch": pytorch,
  }


def _arguments() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default="bert-base,minilm", help="bert-base (random), minilm, or HF BERT dirs")
  parser.add_argument("--shapes", default="64x32,64x64,128x32,128x64", help="batch x length, comma-separated")
  parser.add_argument("--repeats", type=int, default=3, help="timed calls per side (median); alternating")
  parser.add_argument("--matmul", type=int, default=4096, help="side of the square matmul that measures the peak")
  dtypes = ("float32", "bfloat16")
  parser.add_argument("--dtype", default="float32", choices=dtypes, help="compute dtype (torch: CPU autocast)")
  others = ", ".join(OTHER_OPTIONS)
  parser.add_argument("--compare", default="", help=f"also time jaxemb's forward with these compiler options: {others}")
  parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
  args = parser.parse_args()
  args.compare = [name for name in args.compare.split(",") if name]
  unknown = sorted(set(args.compare) - set(OTHER_OPTIONS))
  if unknown:
    parser.error(f"--compare {','.join(unknown)}: not one of {others}")
  return args


HEADER = (
  f"{'model':<10} {'shape':>7} {'jaxemb ms':>10} {'torch ms':>9} {'jaxemb sent/s':>13} {'tok/s':>7} "
  f"{'torch sent/s':>12} {'tok/s':>7} {'ratio':>6} {'matmul GF/s jax/torch':>21} {'jaxemb %pk':>10} "
  f"{'torch %pk':>9}"
)


def _time_shape(args, name, shape, config, params, torch_model, matmuls, matmul_flops):
  """One row of the table: both forwards at `shape` (and the --compare options), timed with the matmuls."""
  batch, length = map(int, shape.split("x"))
  forwards = forward_cases(config, params, torch_model, batch, length, args.dtype, args.compare)
  times = common.interleaved({**forwards, **matmuls}, args.repeats)
  jax_mm, torch_mm = matmul_flops / times["jax matmul"], matmul_flops / times["torch matmul"]
  peak = max(jax_mm, torch_mm)
  flops = batch * buckets.row_flops(config, length)
  ours, theirs = times["jaxemb"], times["pytorch"]
  print(
    f"{name:<10} {shape:>7} {ours * 1e3:10.0f} {theirs * 1e3:9.0f} {batch / ours:13.1f} "
    f"{batch * length / ours:7.0f} {batch / theirs:12.1f} {batch * length / theirs:7.0f} "
    f"{common.ratio(1 / ours, 1 / theirs):>6} {f'{jax_mm / 1e9:.1f}/{torch_mm / 1e9:.1f}':>21} "
    f"{100 * flops / ours / peak:9.1f}% {100 * flops / theirs / peak:8.1f}%",
    flush=True,
  )
  for other in args.compare:
    print(
      f"{'':<18} jaxemb with the {other} compiler options: {times[other] * 1e3:.0f} ms "
      f"({100 * flops / times[other] / peak:.1f}% of peak, {common.ratio(1 / times[other], 1 / theirs)})"
    )


def main():
  args = _arguments()
  if args.threads:
    torch.set_num_threads(args.threads)
  common.print_load("start")
  platform, threads = jax.devices()[0].platform, torch.get_num_threads()
  print(f"jax {jax.__version__} ({platform}), torch {torch.__version__} ({threads} threads)")
  print(f"compute dtype {args.dtype}; jaxemb's CPU options for it: {xla.compiler_options(args.dtype)}")
  matmuls, matmul_flops = matmul_cases(args.matmul, args.dtype)
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      path = common.model_dir(name, pathlib.Path(tmp))
      config, params = load_pretrained(path)
      torch_model = transformers.BertModel.from_pretrained(path, add_pooling_layer=False).eval()
      print(
        f"\n{name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} "
        f"heads, ffn {config.intermediate_size} (torch attention: {torch_model.config._attn_implementation})"
      )
      print(HEADER)
      for shape in args.shapes.split(","):
        _time_shape(args, name, shape, config, params, torch_model, matmuls, matmul_flops)
  print(
    f"\n%pk: forward FLOP/s over the faster of the jax and torch {args.matmul}^2 {args.dtype} matmuls timed in the "
    "same rotation; ratio: jaxemb / PyTorch throughput"
  )
  common.print_load("end")


if __name__ == "__main__":
  main()
