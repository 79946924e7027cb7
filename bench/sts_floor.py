r"""The 7-task STS evaluation against its physical floor on this CPU: the encoder's FLOPs over XLA's measured float32
matmul peak.

It prints, in one run: XLA's float32 matmul throughput on this CPU (a square product, and the encoder's own
projection shapes at a bucket's rows), the FLOPs of the evaluation's encoder passes (matmuls only: projections and
attention's two batched products; real tokens, each sentence at its own length, and padded, the buckets as the
Encoder ran them), and the wall time of `evaluate.py` for the same method in a process of its own, start-up,
tracing and compiling included, as a multiple of the floor (real FLOPs at the peak) and of the floor at the
encoder's own matrix shapes (each projection's FLOPs at its shape's measured rate).

  python bench/sts_floor.py --model ../shared/models/all-MiniLM-L6-v2 --senteval ../shared/data/senteval \
      --method last_avg
"""

import argparse
import pathlib
import re
import subprocess
import sys
import time

import common
import jax
import jax.numpy as jnp
import numpy as np

from jaxemb import buckets  # pylint: disable=g-bad-import-order
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method
from jaxemb.evaluation import sts

REPO = pathlib.Path(__file__).resolve().parent.parent


def matmul_gflops(m: int, k: int, n: int, repeats: int = 5) -> float:
  """XLA's float32 [m, k] x [k, n] product on this CPU, GFLOP/s: the best of `repeats` calls after a warm-up."""
  a, b = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
  product = jax.jit(jnp.dot)
  product(a, b).block_until_ready()
  best = min(common.seconds(lambda: product(a, b).block_until_ready()) for _ in range(repeats))
  return 2 * m * k * n / best / 1e9


def encoder_flops(encoder: Encoder, tasks) -> tuple[float, float, int, list]:
  """(real FLOPs, padded FLOPs, real tokens, the calls: (lengths, rows, width) each) of scoring `tasks` with
  `encoder`: each call's rows and width recorded as the Encoder dispatches them."""
  calls = []
  dispatch = encoder._dispatch  # pylint: disable=protected-access

  def recording(rows, lengths, batch_size, width):
    calls.append((np.asarray(lengths), batch_size, width))
    return dispatch(rows, lengths, batch_size, width)

  encoder._dispatch = recording  # pylint: disable=protected-access
  sts.evaluate_sts(encoder.encode, tasks)
  real = sum(buckets.row_flops(encoder.config, int(length)) for lengths, _, _ in calls for length in lengths)
  padded = sum(buckets.row_flops(encoder.config, width) * batch for _, batch, width in calls)
  return real, padded, sum(int(lengths.sum()) for lengths, _, _ in calls), calls


def merged_predictions(calls, config, peak: float):
  """Prints, for a compile's cost in seconds on this CPU, the shapes and the predicted seconds (padded FLOPs at the
  `peak`, GFLOP/s, plus the compiles) of the recorded calls (each at its own width: the CPU's default) and of the
  same calls at the widths jaxemb.buckets.merged_widths gives them for that cost: what merging would save here."""
  needed = np.array([width for _, _, width in calls])
  (size,) = {batch for _, batch, _ in calls}  # One row count: the default has no batch_tokens cap.
  batch_flops = lambda width: size * buckets.row_flops(config, width)
  for seconds in (0.5, 1.0, 2.0):
    merged = buckets.merged_widths(needed, batch_flops, seconds * peak * 1e9)
    predict = lambda widths: sum(batch_flops(w) for w in widths) / peak / 1e9 + seconds * len(set(widths.tolist()))
    print(
      f"  a compile of {seconds} s: each width its own, {len(set(needed.tolist()))} shapes, "
      f"{predict(needed):.1f} s predicted; merged, {len(set(merged.tolist()))} shapes, {predict(merged):.1f} s"
    )


def evaluate_py_seconds(args) -> tuple[float, str]:
  """(wall seconds, the summary line) of evaluate.py scoring the 7 tasks with `args.method`, in its own process."""
  command = [
    sys.executable,
    str(REPO / "evaluate.py"),
    "--config",
    str(REPO / "configs" / "eval_baselines.py"),
    f"--config.method.name={args.method}",
    f"--config.model.path={args.model}",
    f"--config.data.senteval_dir={args.senteval}",
    "--config.eval.progress=False",
  ]
  start = time.perf_counter()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
  seconds = time.perf_counter() - start
  return seconds, next((line for line in done.stdout.splitlines() if re.search(r": [\d.]+ s, \d+ compiled", line)), "")


def shape_seconds(config, real: float, tokens: int, peaks: dict[str, float]) -> float:
  """Seconds of `real` FLOPs over `tokens` tokens with each projection at its own shape's measured rate (`peaks`,
  GFLOP/s) and attention's products (the rest of `real`) at the query/key/value/output projections' rate: the floor
  the encoder's matrices allow on this CPU, where narrow ones (MiniLM's 384) reach less than a square product."""
  h, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
  qkv_out, ffn_each = layers * 2 * tokens * 4 * h * h, layers * 2 * tokens * h * ffn
  attention = real - qkv_out - 2 * ffn_each
  seconds = (qkv_out + attention) / peaks["qkv/out"] + ffn_each / peaks["ffn in"] + ffn_each / peaks["ffn out"]
  return seconds / 1e9


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, help="HF BERT/RoBERTa directory")
  parser.add_argument("--senteval", required=True, help="SentEval data/downstream folder")
  parser.add_argument("--method", default="last_avg")
  args = parser.parse_args()
  common.print_load("start")
  print(f"CPU: {common.cpu_model()}")
  encoder = Encoder.from_pretrained(args.model, Method(args.method))
  c = encoder.config
  shapes = {"square 2048": (2048, 2048, 2048), "qkv/out": (4096, c.hidden_size, c.hidden_size)}
  shapes["ffn in"] = (4096, c.hidden_size, c.intermediate_size)
  shapes["ffn out"] = (4096, c.intermediate_size, c.hidden_size)
  peaks = {name: matmul_gflops(*shape) for name, shape in shapes.items()}
  peak = max(peaks.values())
  print("XLA float32 matmul, GFLOP/s: " + ", ".join(f"{name} {value:.0f}" for name, value in peaks.items()))
  tasks = [*sts_data.load_sts_tasks(args.senteval), sts_data.load_sts_task(args.senteval, "STSBenchmark", "dev")]
  real, padded, tokens, calls = encoder_flops(encoder, tasks)
  floor = real / (peak * 1e9)
  print(
    f"encoder FLOPs: {real / 1e12:.2f} T real ({tokens:,} tokens), {padded / 1e12:.2f} T padded ({padded / real:.2f}x)"
  )
  print(
    f"floor (real FLOPs at the {peak:.0f} GFLOP/s peak): {floor:.1f} s; padded at the peak {padded / peak / 1e9:.1f} s"
  )
  shaped = shape_seconds(c, real, tokens, peaks)
  print(
    f"at the encoder's own shapes' measured rates (qkv/out, ffn in, ffn out; attention at qkv/out's): {shaped:.1f} s"
    f" real, {shaped * padded / real:.1f} s padded"
  )
  print("merging the buckets (jaxemb.buckets), predicted:")
  merged_predictions(calls, c, peak)
  seconds, line = evaluate_py_seconds(args)
  print(f"evaluate.py ({args.method}, 7 tasks and STS-B dev, start-up and compiling included): {seconds:.1f} s wall")
  print(f"  its own line: {line.strip()}")
  print(f"wall / floor: {seconds / floor:.2f}x (goal <= 1.3x); wall / the shapes' floor: {seconds / shaped:.2f}x")
  common.print_load("end")


if __name__ == "__main__":
  main()
