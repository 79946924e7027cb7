r"""Encoder forward throughput: jaxemb against HF PyTorch on the same weights and inputs, and the share of this
machine's matmul peak that each reaches.

For each model and batch x length it times the jitted jaxemb forward (last hidden state) and HF `BertModel` (no
pooler, torch.inference_mode) alternately, with a large float32 matmul in jax and in torch in the same rotation;
the higher matmul rate is the peak. Both jax functions are compiled as jaxemb compiles the encoder
(`jaxemb.xla.jit`: on the CPU, XLA's Eigen dots rather than YNNPACK's); --xla-defaults adds the forward compiled
with XLA's default options. Forward FLOPs are counted analytically (`common.forward_flops`). The bert-base-sized checkpoint is random, written with HF transformers into a temporary folder and read by
`jaxemb.models.load_pretrained`, so both sides run the same weights.

  python bench/encoder_forward.py                                 # bert-base-sized and MiniLM, 4 shapes each
  python bench/encoder_forward.py --models bert-base --shapes 64x64 --repeats 9
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

from jaxemb import xla  # pylint: disable=g-bad-import-order
from jaxemb.models import Transformer, load_pretrained


def matmul_cases(n: int) -> tuple[dict, float]:
  """({"jax matmul", "torch matmul"} callables, FLOPs) of one [n, n] x [n, n] float32 product."""
  a, b = np.random.default_rng(0).standard_normal((2, n, n), np.float32)
  ja, jb = jnp.asarray(a), jnp.asarray(b)
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  product = xla.jit(jnp.matmul)
  return {"jax matmul": lambda: product(ja, jb).block_until_ready(), "torch matmul": lambda: ta @ tb}, 2.0 * n**3


def forward_cases(config, params, torch_model, batch: int, length: int) -> dict:
  """{"jaxemb", "pytorch", "XLA defaults"}: one forward pass of the same random full-length batch."""
  ids = np.random.default_rng(1).integers(1000, config.vocab_size, (batch, length), dtype=np.int32)
  mask = np.ones_like(ids)
  model = Transformer(config)
  apply = lambda p, i, m: model.apply({"params": p}, i, m).last_hidden_state
  forward = xla.jit(apply)  # As jaxemb.encode compiles it.
  xla_defaults = jax.jit(apply)
  jax_inputs = (jnp.asarray(ids), jnp.asarray(mask))
  torch_inputs = dict(input_ids=torch.from_numpy(ids).long(), attention_mask=torch.from_numpy(mask).long())

  def pytorch():
    with torch.inference_mode():
      return torch_model(**torch_inputs).last_hidden_state

  return {"jaxemb": lambda: forward(params, *jax_inputs).block_until_ready(), "pytorch": pytorch,
          "XLA defaults": lambda: xla_defaults(params, *jax_inputs).block_until_ready()}


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--models", default="bert-base,minilm", help="bert-base (random), minilm, or HF BERT dirs")
  parser.add_argument("--shapes", default="64x32,64x64,128x32,128x64", help="batch x length, comma-separated")
  parser.add_argument("--repeats", type=int, default=3, help="timed calls per side (median); alternating")
  parser.add_argument("--matmul", type=int, default=4096, help="side of the square matmul that measures the peak")
  parser.add_argument("--xla-defaults", action="store_true", help="also time the forward with XLA's defaults")
  parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
  args = parser.parse_args()
  if args.threads:
    torch.set_num_threads(args.threads)
  common.print_load("start")
  print(f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)")
  matmuls, matmul_flops = matmul_cases(args.matmul)
  header = (f"{'model':<10} {'shape':>7} {'jaxemb ms':>10} {'torch ms':>9} {'jaxemb sent/s':>13} {'tok/s':>7} "
            f"{'torch sent/s':>12} {'tok/s':>7} {'ratio':>6} {'matmul GF/s jax/torch':>21} {'jaxemb %pk':>10} "
            f"{'torch %pk':>9}")
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      path = common.model_dir(name, pathlib.Path(tmp))
      config, params = load_pretrained(path)
      torch_model = transformers.BertModel.from_pretrained(path, add_pooling_layer=False).eval()
      print(f"\n{name}: {config.num_hidden_layers} layers, hidden {config.hidden_size}, {config.num_attention_heads} "
            f"heads, ffn {config.intermediate_size} (torch attention: {torch_model.config._attn_implementation})")
      print(header)
      for shape in args.shapes.split(","):
        batch, length = map(int, shape.split("x"))
        forwards = forward_cases(config, params, torch_model, batch, length)
        if not args.xla_defaults:
          del forwards["XLA defaults"]
        times = common.interleaved({**forwards, **matmuls}, args.repeats)
        jax_mm, torch_mm = matmul_flops / times["jax matmul"], matmul_flops / times["torch matmul"]
        peak = max(jax_mm, torch_mm)
        flops = common.forward_flops(batch, length, config.num_hidden_layers, config.hidden_size,
                                     config.intermediate_size, config.num_attention_heads)
        ours, theirs = times["jaxemb"], times["pytorch"]
        print(f"{name:<10} {shape:>7} {ours * 1e3:10.0f} {theirs * 1e3:9.0f} {batch / ours:13.1f} "
              f"{batch * length / ours:7.0f} {batch / theirs:12.1f} {batch * length / theirs:7.0f} "
              f"{common.ratio(1 / ours, 1 / theirs):>6} {f'{jax_mm / 1e9:.1f}/{torch_mm / 1e9:.1f}':>21} "
              f"{100 * flops / ours / peak:9.1f}% "
              f"{100 * flops / theirs / peak:8.1f}%", flush=True)
        if args.xla_defaults:
          print(f"{'':<18} jaxemb with XLA's default compiler options: {times['XLA defaults'] * 1e3:.0f} ms "
                f"({100 * flops / times['XLA defaults'] / peak:.1f}% of peak)")
  print(f"\n%pk: forward FLOP/s over the faster of the jax and torch {args.matmul}^2 float32 matmuls timed in the same "
        "rotation; ratio: jaxemb / PyTorch throughput")
  common.print_load("end")


if __name__ == "__main__":
  main()
