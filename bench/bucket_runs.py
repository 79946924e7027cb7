r"""A training run with its directory in a bucket against the same run on the local disk: the step rate and the time
a checkpoint save holds the loop.

The bucket is a real Cloud Storage emulator on loopback (fake-gcs-server, jaxemb/testing/gcs.py's GcsEmulator), so the
numbers say what jaxemb's own work costs (a save handed to Orbax's background thread, the metrics and TensorBoard
written by their thread), not a network's. The emulator shares the CPU with the run: the uploads it receives take cycles
a real bucket would not. The runs alternate (local, bucket, local, bucket) in one process, so the programs compile once
where the compilation cache keeps them (a warm-up run, not counted) and load from other jobs hits both alike. The step
rate is the median of the logged examples/s (metrics.jsonl: evaluations left out, saves and metrics writes in) over the
records after the first: a record that holds a compile is an outlier either way.

  python bench/bucket_runs.py                          # MiniLM, batch 16, 60 steps, saved every 10
  python bench/bucket_runs.py --steps 100 --save-every 20 --repeats 3
"""

import argparse
import functools
import json
import pathlib
import statistics
import tempfile
import time

import common

from jaxemb import storage, xla  # pylint: disable=g-bad-import-order
from jaxemb.training import checkpoints, loop
from jaxemb.testing.gcs import GcsEmulator
from jaxemb.spec import TrainingRun
from testing_support.shared import SHARED


def _config(workdir: str, senteval: str, model: pathlib.Path, args):
  config = common.train_config("promptbert", args.batch_size, 32)
  config.model.path = str(model)
  config.data.train_file = str(SHARED / "data" / "wiki" / "wiki1m_sample.txt")
  config.data.senteval_dir = senteval
  config.workdir = workdir
  config.train.num_steps = args.steps
  config.train.save_every = args.save_every
  config.train.log_every = args.log_every
  config.evals.stsb_dev.every = args.steps  # Scored before and after: selection's cost is not the question here.
  return config


def _short_senteval(root) -> str:
  """SentEval with STS-B dev cut to 40 pairs: the runs score it before and after training."""
  dev = (SHARED / "data" / "senteval" / "STS" / "STSBenchmark" / "sts-dev.csv").read_text(encoding="utf-8")
  folder = root / "senteval" / "STS" / "STSBenchmark"
  folder.mkdir(parents=True)
  (folder / "sts-dev.csv").write_text("".join(dev.splitlines(True)[:40]), encoding="utf-8")
  return str(root / "senteval")


def _timed_saves(blocked: list[float]):
  """RunCheckpoints.save, recording how long each call holds the loop."""
  save = checkpoints.RunCheckpoints.save

  @functools.wraps(save)
  def timed(self, *args):
    start = time.perf_counter()
    save(self, *args)
    blocked.append(time.perf_counter() - start)

  checkpoints.RunCheckpoints.save = timed


def _run(config, blocked: list[float]) -> tuple[float, list[float]]:
  """(the median examples/s of the logged records after the first: a record with a compile in it is an outlier,
  seconds each periodic save held the loop)."""
  blocked.clear()
  loop.train(TrainingRun.from_config(config))
  lines = (storage.path(config.workdir) / "metrics.jsonl").read_text().splitlines()
  records = [json.loads(line) for line in lines]
  rates = [r["examples_per_second"] for r in records if "examples_per_second" in r][1:]
  return statistics.median(rates), list(blocked)


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="minilm", help="minilm, bert-base, or a Hugging Face directory")
  parser.add_argument("--batch-size", type=int, default=16)
  parser.add_argument("--steps", type=int, default=60)
  parser.add_argument("--save-every", type=int, default=10)
  parser.add_argument("--log-every", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=2, help="runs of each kind, alternating")
  args = parser.parse_args()
  common.print_load("before")
  emulator = GcsEmulator()
  blocked = []
  _timed_saves(blocked)
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    senteval, model = _short_senteval(tmp), common.model_dir(args.model, tmp)
    xla.use_compilation_cache(str(tmp / "xla"))  # Each run builds its step anew: compiled once, then loaded.
    _run(_config(str(tmp / "warmup"), senteval, model, args), blocked)
    results = {"local": [], "bucket": []}
    for i in range(args.repeats):
      bucket = f"gs://{emulator.bucket()}"
      for kind, workdir in (("local", str(tmp / f"run{i}")), ("bucket", f"{bucket}/run{i}")):
        results[kind].append(_run(_config(workdir, senteval, model, args), blocked))
        print(f"{kind} run {i}: {results[kind][-1][0]:.1f} examples/s", flush=True)
  emulator.stop()
  common.print_load("after")
  print(
    f"\n{common.cpu_model()}: {args.model}, batch {args.batch_size}, {args.steps} steps, saved every "
    f"{args.save_every}, logged every {args.log_every}, {args.repeats} runs each (alternating)"
  )
  print("| workdir | examples/s | vs local | a save holds the loop (mean / max) |")
  print("|---|---|---|---|")
  local = statistics.mean(rate for rate, _ in results["local"])
  for kind, runs in results.items():
    rate = statistics.mean(r for r, _ in runs)
    saves = [s for _, blocks in runs for s in blocks]
    print(
      f"| {kind} | {rate:.1f} | {common.ratio(rate, local)} | {1e3 * statistics.mean(saves):.0f} / "
      f"{1e3 * max(saves):.0f} ms |"
    )


if __name__ == "__main__":
  main()
