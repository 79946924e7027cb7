"""Retrieval a user can see: each STS-B test pair scored >= 4 asks for the second sentence from the first, among all
distinct STS-B test sentences.

MiniLM (all-MiniLM-L6-v2) with `last_avg` embeds the pool, every distinct sentence of the 1,379 STS-B test pairs
(SentEval's view: whitespace re-joined, as evaluate.py reads them), with `Encoder.encode`; each pair of gold score
>= `--min_score` whose sentences differ is a query (its first sentence's row, excluded from its own neighbours) and
its partner (the second's). Prints recall@1 and recall@10 of the partner (cosine), for the exact search and for
the approximate one (`jax.lax.approx_max_k` at `--recall_target`), with the approximate search's recall@10 of the
exact neighbours.

Usage: python bench/retrieval_stsb.py [--model minilm] [--method last_avg] [--min_score 4] [--recall_target 0.95]
"""

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

# pylint: disable=wrong-import-position
from bench.common import MINILM, SHARED, print_load
import numpy as np

from jaxemb import search
from jaxemb.data import sts
from jaxemb.encode import Encoder
from jaxemb.evaluation import common


def pairs_and_pool(senteval: pathlib.Path, min_score: float) -> tuple[list[str], np.ndarray, np.ndarray, int]:
  """(the pool: every distinct test sentence; the query and partner rows of the pairs scored >= `min_score`; the
  pairs left out because their two sentences are the same text)."""
  subset = sts.load_sts_task(senteval, "STSBenchmark", "test").subsets["test"]
  view = common.preprocess(join_tokens=True, add_period=False)
  first, second = [view(s) for s in subset.sentences1], [view(s) for s in subset.sentences2]
  pool = list(dict.fromkeys(first + second))
  row = {sentence: i for i, sentence in enumerate(pool)}
  chosen = [(row[a], row[b]) for a, b, score in zip(first, second, subset.scores) if score >= min_score]
  kept = np.array([(a, b) for a, b in chosen if a != b])
  return pool, kept[:, 0], kept[:, 1], len(chosen) - len(kept)


def partner_recall(found: np.ndarray, partners: np.ndarray, k: int) -> float:
  """The share of queries whose partner is among their first `k` neighbours."""
  return float((found[:, :k] == partners[:, None]).any(axis=1).mean())


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="minilm", help='"minilm" (../shared) or a HF checkpoint directory')
  parser.add_argument("--method", default="last_avg", help="the sentence-embedding method")
  parser.add_argument("--min_score", type=float, default=4.0, help="the gold score a pair needs to be a query")
  parser.add_argument("--recall_target", type=float, default=0.95, help="approx_max_k's recall target")
  args = parser.parse_args()
  print_load("before")
  pool, queries, partners, same = pairs_and_pool(SHARED / "data" / "senteval", args.min_score)
  started = time.perf_counter()
  model = MINILM if args.model == "minilm" else pathlib.Path(args.model)
  vectors = Encoder.from_pretrained(model, args.method).encode(pool)
  print(f"{len(pool):,} distinct STS-B test sentences embedded in {time.perf_counter() - started:.1f} s")
  print(f"{len(queries):,} queries: pairs scored >= {args.min_score:g} ({same} more left out: the same text twice)")
  found = {}
  for kind, approximate in (("exact", False), ("approximate", True)):
    started = time.perf_counter()
    found[kind] = search.search(
      vectors[queries], vectors, 10, approximate=approximate, recall_target=args.recall_target, exclude=queries
    ).rows
    seconds = time.perf_counter() - started
    recalls = ", ".join(f"recall@{k} {partner_recall(found[kind], partners, k):.4f}" for k in (1, 10))
    print(f"  {kind:<11} partner {recalls}  ({seconds:.2f} s, compile included)")
  exact_recall = search.recall(found["approximate"], found["exact"])
  print(f"  approximate (recall_target {args.recall_target}): recall@10 of the exact neighbours {exact_recall:.4f}")
  print_load("after")


if __name__ == "__main__":
  main()
