r"""Whether embed.py finishes with each CPU dot library: runs it again and again, in processes of its own, on a corpus
of three sentences, one of them 3,000 words, each kept to 510 tokens (`eval.max_sentence_tokens`: one call of 3 x 512
rows, a short batch of long rows), alternating oneDNN's float32 dots and XLA's Eigen dots (set through
$JAXEMB_XLA_CPU_OPTIONS), and counts the runs that finished, hung (still running after --timeout seconds, then
killed) and crashed (killed by a signal or aborted).

jaxemb takes oneDNN's dots only on CPUs with AVX-512 (`jaxemb.xla.onednn_dots`): on an AVX2 CPU oneDNN's gemm
kernels hang XLA's thread pool now and then (docs/benchmarks.md, "oneDNN's dots without AVX-512"). On a CPU with
AVX-512 this says whether its kernels do too; a run takes about 10 s. `--dtype bfloat16` computes in bfloat16 and
alternates its dots (YNNPACK's, jaxemb's bfloat16 default) with Eigen's instead.

  python bench/cpu_dots_stress.py                 # 20 runs each, MiniLM from ../shared
  python bench/cpu_dots_stress.py --runs 50 --timeout 90
  python bench/cpu_dots_stress.py --dtype bfloat16
"""

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile

import common
from jaxemb import xla

MINILM = common.SHARED / "models" / "all-MiniLM-L6-v2"
EIGEN = {**xla.EIGEN_DOTS, "xla_cpu_use_onednn": False, "xla_cpu_experimental_onednn_fusion_type": ""}
# Per compute dtype: jaxemb's dot library for it, against Eigen's.
LIBRARIES = {
  "float32": {"oneDNN": xla.CPU_OPTIONS["float32"], "Eigen": EIGEN},
  "bfloat16": {"YNNPACK": xla.CPU_OPTIONS["bfloat16"], "Eigen": EIGEN},
}


def _corpus(path: pathlib.Path):
  words = random.Random(0).choices("the quick brown fox jumps over a lazy dog while singing".split(), k=3000)
  path.write_text(f"a short one.\n{' '.join(words)}\nanother short one.\n")


def _run(
  options: dict, dtype: str, corpus: pathlib.Path, out: pathlib.Path, cache: pathlib.Path, timeout: float
) -> str:
  """One embed.py run computing in `dtype` with `options` as its CPU dots: "finished", "hung" or "crashed (...)"."""
  command = [
    sys.executable,
    "embed.py",
    "--config",
    "configs/embed.py",
    f"--config.model.path={MINILM}",
    f"--config.embed.corpus={corpus}",
    f"--config.embed.output={out}",
    f"--config.compilation_cache_dir={cache}",
    "--config.eval.progress=False",
    "--config.eval.max_sentence_tokens=510",  # Past MiniLM's own 254: at rows of 256 no run hung (docs/benchmarks.md).
    f"--config.model.dtype={dtype}",
  ]
  env = {**os.environ, xla.OPTIONS_ENV: json.dumps(options)}
  with subprocess.Popen(command, cwd=common.REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as run:
    try:
      _, stderr = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
      run.kill()
      run.communicate()
      return "hung"
  if run.returncode == 0:
    return "finished"
  if run.returncode < 0:
    return f"crashed ({signal.Signals(-run.returncode).name})"
  last = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
  return f"crashed (exit {run.returncode}: {last[0][:120]})"


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--runs", type=int, default=20, help="runs of each library")
  parser.add_argument("--timeout", type=float, default=60.0, help="seconds after which a run counts as hung")
  parser.add_argument("--dtype", choices=sorted(LIBRARIES), default="float32", help="the model's compute dtype")
  args = parser.parse_args()
  common.print_load("before")
  print(f"jaxemb's float32 dots on this CPU: {'oneDNN' if xla.onednn_dots() else 'Eigen'}", flush=True)
  libraries = LIBRARIES[args.dtype]
  counts = {name: {} for name in libraries}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    _corpus(tmp / "corpus.txt")
    for k in range(args.runs):
      for name, options in libraries.items():
        outcome = _run(options, args.dtype, tmp / "corpus.txt", tmp / f"out-{name}-{k}", tmp / "xla", args.timeout)
        counts[name][outcome] = counts[name].get(outcome, 0) + 1
        print(f"run {k + 1} {name}: {outcome}", flush=True)
  common.print_load("after")
  print(f"| {args.dtype} dots | runs | finished | hung | crashed |\n|---|---|---|---|---|")
  for name, outcomes in counts.items():
    crashed = sum(n for outcome, n in outcomes.items() if outcome.startswith("crashed"))
    print(f"| {name} | {args.runs} | {outcomes.get('finished', 0)} | {outcomes.get('hung', 0)} | {crashed} |")


if __name__ == "__main__":
  main()
