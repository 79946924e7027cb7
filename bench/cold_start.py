r"""Cold and warm starts: README's evaluate.py command and a 50-step train.py (README's quickstart at 50 steps), each
run twice in processes of their own with one fresh compilation cache: the first run compiles every program, the
second loads what the cache keeps (jaxemb/xla.py: all but the encoder's oneDNN forward). Prints each run's wall time,
the train run's time to its first step (its summary line) and the second run's time against the first.

  python bench/cold_start.py                            # MiniLM from ../shared, STS data from data/senteval
  python bench/cold_start.py --steps 20 --only train --senteval ../shared/data/senteval   # a clone without prepare.py
"""

import argparse
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import common

MINILM = common.SHARED / "models" / "all-MiniLM-L6-v2"


def _commands(args, cache: pathlib.Path, workdir: pathlib.Path) -> dict[str, list[str]]:
  evaluate = [
    sys.executable,
    "evaluate.py",
    "--config",
    "configs/eval_prompt.py",
    f"--config.model.path={MINILM}",
    f"--config.compilation_cache_dir={cache}",
    "--config.eval.progress=False",
  ]
  train = [
    sys.executable,
    "train.py",
    "--config",
    "configs/promptbert.py",
    f"--config.model.path={MINILM}",
    f"--config.data.train_file={common.SHARED / 'data' / 'wiki' / 'wiki1m_sample.txt'}",
    f"--config.workdir={workdir}",
    f"--config.train.num_steps={args.steps}",
    "--config.train.batch_size=16",
    f"--config.compilation_cache_dir={cache}",
  ]
  senteval = [f"--config.data.senteval_dir={args.senteval}"] if args.senteval else []
  return {"evaluate": evaluate + senteval, "train": train + senteval}


def _run(command: list[str]) -> tuple[float, str]:
  """(wall seconds, the seconds to the first step its summary line gives, or '')."""
  env = {**os.environ, "PYTHONUNBUFFERED": "1"}
  start = time.perf_counter()
  result = subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True, check=False)
  seconds = time.perf_counter() - start
  if result.returncode:
    sys.exit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
  first = re.findall(r"the first ([\d.]+) s after the start", result.stdout + result.stderr)
  return seconds, first[-1] if first else ""


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--only", choices=("evaluate", "train"))
  parser.add_argument("--senteval", help="SentEval's folder, if not the configs' default (data/senteval)")
  args = parser.parse_args()
  common.print_load("before")
  with tempfile.TemporaryDirectory(prefix="jaxemb-cold-start-") as root:
    root = pathlib.Path(root)
    for name in [name for name in ("evaluate", "train") if args.only in (None, name)]:
      cache = root / f"xla-{name}"
      times = []
      for run in ("cold", "warm"):
        command = _commands(args, cache, root / f"run-{name}-{run}")[name]
        seconds, first = _run(command)
        times.append(seconds)
        first = f", first step {first} s after the start" if first else ""
        print(f"{name:9s} {run}: {seconds:6.1f} s wall{first}", flush=True)
      print(f"{name:9s} warm / cold: {times[1] / times[0]:.2f}", flush=True)
  common.print_load("after")


if __name__ == "__main__":
  main()
