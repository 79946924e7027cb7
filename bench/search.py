"""Exact top-k search, jaxemb.search against FAISS's flat inner-product index, on the same vectors and this CPU.

A random corpus of `--rows` unit vectors of `--dim` float32 and `--queries` unit queries (the cosine of normalised
vectors is their inner product): `jaxemb.search.search` (metric "cosine", which also normalises each block on the
device, and "dot") against `faiss.IndexFlatIP.search` with FAISS's OpenMP threads at the CPU count, timed in
interleaved rounds after one warm-up call each (jaxemb's compiles there). Prints queries/s, each side's median and
FAISS's time over jaxemb's per round (above 1: jaxemb is faster), and how many neighbours the two agree on.

Usage: python bench/search.py [--rows 100000] [--dim 384] [--queries 1000] [--k 10] [--block_rows N]
"""

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# pylint: disable=wrong-import-position
from bench.common import interleaved_rounds, medians, per_round_ratio, print_load
import numpy as np

from jaxemb import search


def unit_rows(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
  x = rng.standard_normal((rows, dim), dtype=np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--rows", type=int, default=100_000, help="corpus vectors")
  parser.add_argument("--dim", type=int, default=384, help="their dimension (MiniLM's 384)")
  parser.add_argument("--queries", type=int, default=1000, help="query vectors per search")
  parser.add_argument("--k", type=int, default=10, help="neighbours per query")
  parser.add_argument(
    "--block_rows", type=int, help=f"jaxemb's corpus rows per step (default: at most {search.BLOCK_ROWS:,}, evened out)"
  )
  parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
  args = parser.parse_args()
  import faiss  # pylint: disable=g-import-not-at-top  # Optional: requirements-test.txt.

  faiss.omp_set_num_threads(os.cpu_count())
  print_load("before")
  rng = np.random.default_rng(0)
  corpus, queries = unit_rows(rng, args.rows, args.dim), unit_rows(rng, args.queries, args.dim)
  index = faiss.IndexFlatIP(args.dim)
  index.add(corpus)
  found = {}

  def ours(metric):
    found[metric] = search.search(queries, corpus, args.k, metric=metric, block_rows=args.block_rows).rows

  def theirs():
    found["faiss"] = index.search(queries, args.k)[1]

  cases = {"jaxemb cosine": lambda: ours("cosine"), "jaxemb dot": lambda: ours("dot"), "faiss IndexFlatIP": theirs}
  rounds = interleaved_rounds(cases, args.repeats)
  blocks = f"block_rows={args.block_rows}" if args.block_rows else "jaxemb's default blocks"
  print(f"{args.queries:,} queries, top {args.k} of {args.rows:,} x {args.dim} float32, {blocks}")
  for name, median in medians(rounds).items():
    print(f"  {name:<18} {args.queries / median:>9,.0f} queries/s  ({median:.3f} s a search)")
  for metric in ("cosine", "dot"):
    ratio = per_round_ratio(rounds[f"jaxemb {metric}"], rounds["faiss IndexFlatIP"])
    same = (np.sort(found[metric], axis=1) == np.sort(found["faiss"], axis=1)).mean()
    print(f"  jaxemb {metric}: FAISS's time / jaxemb's {ratio} (median per round); same neighbours: {same:.4%}")
  print_load("after")


if __name__ == "__main__":
  main()
