r"""embed.py against sentence-transformers on the wiki sample: sentences/s and peak memory.

Each side runs in a process of its own, the two alternating over --repeats, and its peak resident memory is the
kernel's record of that process (os.wait4's ru_maxrss): imports, the model, the encoding. jaxemb: the embed.py
command with MiniLM and `last_avg` (mean pooling over the tokens: what the checkpoint's sentence-transformers
modules compute), normalized as MiniLM's Normalize module does, float32; its rate is its own summary line's (the
encoding with its bucket compiles and the shards' writes, after the model and corpus are read). sentence-transformers:
`SentenceTransformer(model).encode(lines, batch_size=...)` timed the same way, after the model is loaded. Both encode
every line (blank ones too) at the same batch size; the vectors of the two sides are compared at the end. On a GPU
machine (`--device cuda`) sentence-transformers runs there and embed.py on JAX's default backend, both in float32
(bench/device_session.sh's measure-embed: a MiniLM-shaped model of random weights, which the window cannot carry).

  python bench/embed.py                                  # the wiki sample, configs/embed.py's defaults, 2 repeats
  python bench/embed.py --repeats 1 --set embed.shard_rows=2000 --set eval.length_multiple=16
  python bench/embed.py --device cuda --model DIR --corpus FILE --batch_size 256
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# pylint: disable=wrong-import-position
from testing_support.shared import SHARED

# Torch's OpenMP threads spin-wait between ops by default, which stalls them on a shared 2-core machine (as
# bench/common.py says); set before the worker imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
MINILM = SHARED / "models" / "all-MiniLM-L6-v2"
WIKI = SHARED / "data" / "wiki" / "wiki1m_sample.txt"


def _lines(corpus: pathlib.Path) -> list[str]:
  """Every line of the corpus, blank ones too, as embed.py reads a text corpus."""
  return corpus.read_text(encoding="utf-8").split("\n")[:-1]


def st_worker(args):
  """The sentence-transformers side, in its own process: prints its seconds as JSON, saves its vectors."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel

  model = SentenceTransformer(str(args.model), device=args.device)
  lines = _lines(args.corpus)
  start = time.perf_counter()
  vectors = model.encode(lines, batch_size=args.batch_size, show_progress_bar=False)  # Numpy: synchronised.
  seconds = time.perf_counter() - start
  np.save(args.worker_out, vectors)
  print(json.dumps({"seconds": seconds, "rows": len(vectors)}))


def _run(command: list[str]) -> tuple[str, float, float]:
  """(stdout, wall seconds, peak RSS in MiB) of `command` run to its end; its stderr goes to ours."""
  with tempfile.TemporaryFile("w+") as out:
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=out)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    out.seek(0)
    stdout = out.read()
  if process.returncode:
    raise SystemExit(f"{command[:3]} exited with {process.returncode}:\n{stdout[-2000:]}")
  return stdout, wall, usage.ru_maxrss / 1024


def jaxemb_side(args, folder: pathlib.Path) -> dict[str, float]:
  command = [
    sys.executable,
    "embed.py",
    "--config",
    "configs/embed.py",
    f"--config.model.path={args.model}",
    "--config.method.name=last_avg",
    f"--config.embed.corpus={args.corpus}",
    f"--config.embed.output={folder}",
    "--config.embed.normalize=True",
    f"--config.eval.batch_size={args.batch_size}",
    "--config.eval.progress=False",
    *(f"--config.{setting}" for setting in args.set),
  ]
  stdout, wall, rss = _run(command)
  line = stdout.strip().splitlines()[-1]
  sentences, seconds = re.search(r"embedded ([\d,]+) sentences into .* in ([\d.]+) s", line).groups()
  return {"rate": int(sentences.replace(",", "")) / float(seconds), "wall": wall, "rss": rss, "line": line}


def st_side(args, vectors_file: pathlib.Path) -> dict[str, float]:
  command = [sys.executable, __file__, "--worker", "st", "--worker_out", str(vectors_file)]
  command += ["--model", str(args.model), "--corpus", str(args.corpus), "--batch_size", str(args.batch_size)]
  command += ["--device", args.device]
  stdout, wall, rss = _run(command)
  done = json.loads(stdout.strip().splitlines()[-1])
  return {"rate": done["rows"] / done["seconds"], "wall": wall, "rss": rss}


def _table(rows: dict[str, list[dict[str, float]]]):
  best = {side: max(runs, key=lambda r: r["rate"]) for side, runs in rows.items()}
  print(f"{'side':<22} {'sentences/s (runs)':<28} {'best':>8} {'wall s':>8} {'peak RSS MiB':>13}")
  for side, runs in rows.items():
    rates = ", ".join(f"{r['rate']:,.0f}" for r in runs)
    peak = max(r["rss"] for r in runs)
    print(f"{side:<22} {rates:<28} {best[side]['rate']:>8,.0f} {best[side]['wall']:>8.1f} {peak:>13,.0f}")
  ours, theirs = best["jaxemb embed.py"], best["sentence-transformers"]
  peaks = [max(r["rss"] for r in runs) for runs in rows.values()]
  print(f"jaxemb / sentence-transformers: {ours['rate'] / theirs['rate']:.2f}x the sentences/s, ", end="")
  print(f"{peaks[0] / peaks[1]:.2f}x the peak RSS")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", type=pathlib.Path, default=MINILM)
  parser.add_argument("--corpus", type=pathlib.Path, default=WIKI)
  parser.add_argument("--batch_size", type=int, default=64, help="Sentences per encoder call, both sides.")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--device", default="cpu", help="sentence-transformers' device (cuda: a GPU's)")
  parser.add_argument("--set", action="append", default=[], help="embed.py's config.FIELD=VALUE (repeatable)")
  parser.add_argument("--worker", choices=["st"], help=argparse.SUPPRESS)
  parser.add_argument("--worker_out", type=pathlib.Path, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    return st_worker(args)
  sys.path.insert(0, str(REPO / "bench"))
  import common  # pylint: disable=import-outside-toplevel  # Not in the worker: it loads jax, which it would measure.

  common.print_load("start")
  settings = "".join(f", --config.{setting}" for setting in args.set)
  print(f"{len(_lines(args.corpus)):,} lines of {args.corpus}, batches of {args.batch_size}{settings}")
  rows = {"jaxemb embed.py": [], "sentence-transformers": []}
  with tempfile.TemporaryDirectory(prefix="jaxemb-bench-embed-") as folder:
    folder = pathlib.Path(folder)
    for repeat in range(args.repeats):
      rows["jaxemb embed.py"].append(jaxemb_side(args, folder / f"out{repeat}"))
      rows["sentence-transformers"].append(st_side(args, folder / "st.npy"))
    print(rows["jaxemb embed.py"][-1]["line"])
    from jaxemb import embedding  # pylint: disable=import-outside-toplevel

    ours, theirs = embedding.load(folder / "out0").vectors[:], np.load(folder / "st.npy")
    print(f"vectors: max |jaxemb - sentence-transformers| {np.abs(ours - theirs).max():.2e}")
  _table(rows)
  common.print_load("end")


if __name__ == "__main__":
  main()
