r"""Scaling: the sharded train step on 1, 2, 4 and 8 simulated devices, and evaluation as the sentences double.

Train step: one worker process per device count n, started with XLA_FLAGS=--xla_force_host_platform_device_count=n
(set before jax is imported), builds the step as the training loop does on `sharding.make_mesh(-1, fsdp)` over its
n devices, same global batch; the parent times one step of each worker in turn, so load hits every mesh alike.
The simulated devices share this machine's cores: the ideal is a flat time, and the excess over 1 device is the
cost of sharding (per-device programs, smaller matmuls, the gathers of the global-batch loss).

Evaluation: `Encoder.encode` (MiniLM, last_avg) on 1k, 2k, 4k, 8k distinct STS sentences after one pass that
compiles every bucket shape; time per 1k sentences should stay flat (fixed per-call costs aside), and so should
the host memory per sentence (tracemalloc's peak while encoding, which sees the NumPy arrays and the tokenizer's
lists): every sentence is tokenised up front, then the encoder runs batches of one fixed size.

  python bench/scaling.py                           # SimCSE step on MiniLM, batch 64; 1k..8k sentences
  python bench/scaling.py --config promptbert --fsdp 2 --sizes 1000,2000,4000,8000,16000
"""

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc

import common
import numpy as np

from jaxemb import sharding  # pylint: disable=g-bad-import-order
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method


def worker(args):
  """Builds the step on every device this process has, then runs one step per "step" line read on stdin."""
  with tempfile.TemporaryDirectory() as tmp:
    config = common.train_config(args.config, args.batch, args.tokens)
    config.train.steps_per_call = 1  # s/step across meshes, each call one step.
    mesh = sharding.make_mesh(-1, args.fsdp)
    step = common.JaxembTrainStep(
      config, common.model_dir(args.model, pathlib.Path(tmp)), common.wiki_sentences(args.batch), mesh
    )
    print(f"ready {dict(mesh.shape)}", flush=True)
    for _ in sys.stdin:
      print(step(), flush=True)


class Worker:
  """A worker process with `devices` simulated devices; calling it runs one train step there."""

  def __init__(self, devices: int, args):
    env = {
      **os.environ,
      "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}",
    }
    fsdp = args.fsdp if devices % args.fsdp == 0 else 1
    command = [
      sys.executable,
      __file__,
      "--worker",
      f"--config={args.config}",
      f"--model={args.model}",
      f"--batch={args.batch}",
      f"--tokens={args.tokens}",
      f"--fsdp={fsdp}",
    ]
    self.process = subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.mesh = None

  def wait_ready(self):
    line = self.process.stdout.readline()
    if not line.startswith("ready"):
      raise RuntimeError(f"worker failed to start (exit code {self.process.wait()})")
    self.mesh = line.split(" ", 1)[1].strip()

  def __call__(self) -> float:
    self.process.stdin.write("step\n")
    self.process.stdin.flush()
    return float(self.process.stdout.readline())

  def close(self):
    self.process.stdin.close()
    self.process.wait()


def train_step_scaling(args):
  workers = {n: Worker(n, args) for n in map(int, args.devices.split(","))}
  try:
    for w in workers.values():
      w.wait_ready()
    times = common.interleaved(workers, args.repeats)
  finally:
    for w in workers.values():
      w.close()
  print(f"\n== {args.config} train step, {args.model}, global batch {args.batch}, {args.tokens} sentence tokens")
  print(f"{'devices':>7} {'mesh':<24} {'s/step':>7} {'vs 1 device':>11}")
  base = times[min(times)]
  for n, seconds in times.items():
    print(f"{n:>7} {workers[n].mesh:<24} {seconds:7.2f} {seconds / base:10.2f}x", flush=True)


def eval_scaling(args):
  sentences = [
    s
    for task in sts_data.load_sts_tasks(args.senteval)
    for subset in task.subsets.values()
    for s in subset.sentences1 + subset.sentences2
  ]
  sentences = list(dict.fromkeys(map(sts_data.join_tokens, sentences)))
  sentences = [sentences[i] for i in np.random.default_rng(0).permutation(len(sentences))]
  sizes = [int(n) for n in args.sizes.split(",")]
  encoder = Encoder.from_pretrained(common.MINILM, Method("last_avg"))
  encoder.encode(sentences[: max(sizes)], batch_size=128)  # Compiles every bucket shape the sizes need.
  peaks = {}

  def run(n):
    tracemalloc.start()
    vectors = encoder.encode(sentences[:n], batch_size=128)
    peaks[n] = (tracemalloc.get_traced_memory()[1], vectors.nbytes)
    tracemalloc.stop()

  times = common.interleaved({n: lambda n=n: run(n) for n in sizes}, args.repeats, warmup=0)
  print(f"\n== evaluation: MiniLM last_avg, batch 128, {encoder.compilations} compiled shapes")
  print(f"{'sentences':>9} {'s':>7} {'s per 1k':>8} {'host peak MB':>12} {'vectors MB':>10} {'rest KB/sentence':>16}")
  for n, seconds in times.items():
    peak, output = peaks[n]
    print(
      f"{n:>9} {seconds:7.2f} {1000 * seconds / n:8.3f} {peak / 2**20:12.1f} {output / 2**20:10.1f} "
      f"{(peak - output) / 2**10 / n:16.2f}",
      flush=True,
    )
  print(f"peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10:.0f} MB")


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", default="simcse", help="configs/<name>.py of the train step")
  parser.add_argument("--model", default="minilm", help="minilm, bert-base (random, bert-base-sized), or a HF dir")
  parser.add_argument("--batch", type=int, default=64, help="global batch size")
  parser.add_argument("--tokens", type=int, default=32, help="max_sentence_tokens")
  parser.add_argument("--devices", default="1,2,4,8", help="simulated device counts")
  parser.add_argument("--fsdp", type=int, default=1, help="fsdp axis size (where it divides the devices)")
  parser.add_argument("--sizes", default="1000,2000,4000,8000", help="evaluation sentence counts")
  parser.add_argument("--senteval", default=str(common.SHARED / "data" / "senteval"))
  parser.add_argument("--repeats", type=int, default=3, help="timed calls per case (median); alternating")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args)
    return
  common.print_load("start")
  start = time.perf_counter()
  train_step_scaling(args)
  eval_scaling(args)
  print(f"\ntotal {time.perf_counter() - start:.0f} s")
  common.print_load("end")


if __name__ == "__main__":
  main()
