"""Tokenising and caching a wiki1m-sized corpus: wall time, peak memory and cache size.

A corpus of `--lines` lines (default 1,000,000, wiki1m's size) is built from `../shared`'s wiki1m sample: line i
is sample line i mod n with its words rotated by i div n, so every line is distinct (no tokenizer cache helps) and
reads like wiki text. Each measurement runs in a fresh subprocess, so its peak RSS is its own:

- read: `corpus.read_sentences` (Hugging Face `datasets`, as SimCSE reads wiki1m), its first read (building the
  Arrow cache) timed; every later phase reads it again from that cache, untimed, and its peak RSS includes the list;
- cold: `corpus.tokenize_cached` with an empty cache (the PromptBERT training template, as train.py calls it);
- warm: the same call reading the cache;
- reference: `templates.tokenize_sentences` over the whole list in one tokenizer call (`templates.TOKENIZE_CHUNK` set
  to the list's length), the path tokenize_cached took before it worked in chunks: every token a Python int at once.

Usage: python bench/tokenize_corpus.py [--lines 1000000] [--tokenizer bert-base-uncased]
"""

import argparse
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import SHARED, print_load  # pylint: disable=wrong-import-position

TEMPLATE = 'This sentence of "[X]" means[MASK].'  # PromptBERT's training view 1 (configs/train_common.py).
MAX_SENTENCE_TOKENS = 30  # SimCSE's max_seq_length 32 less [CLS] and [SEP] (data.max_sentence_tokens).


def write_corpus(path: pathlib.Path, num_lines: int):
  sample = [
    line.split()
    for line in SHARED.joinpath("data", "wiki", "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()
  ]
  with path.open("w", encoding="utf-8") as f:
    for i in range(num_lines):
      words = sample[i % len(sample)]
      shift = (i // len(sample)) % max(len(words), 1)
      f.write(" ".join(words[shift:] + words[:shift]) + "\n")


def measure(phase: str, corpus_file: str, tokenizer_dir: str, cache_dir: str) -> dict:
  """One phase, in this process; prints its numbers as JSON."""
  from jaxemb import templates  # pylint: disable=g-import-not-at-top
  from jaxemb.data import corpus
  from jaxemb.models import load_tokenizer

  tokenizer = load_tokenizer(tokenizer_dir)
  template = templates.Template.parse(TEMPLATE, tokenizer)
  start = time.perf_counter()
  sentences = corpus.read_sentences(corpus_file, cache_dir=os.path.join(cache_dir, "datasets"))
  read_seconds = time.perf_counter() - start
  start = time.perf_counter()
  if phase == "read":
    rows = len(sentences)
  elif phase == "reference":
    templates.TOKENIZE_CHUNK = len(sentences)  # One tokenizer call, as before tokenize_sentences worked in chunks too.
    rows = len(
      templates.tokenize_sentences(
        template,
        tokenizer,
        sentences,
        max_sentence_tokens=MAX_SENTENCE_TOKENS,
        pad_to=template.num_tokens + MAX_SENTENCE_TOKENS,
        tokenization="alone",
      ).input_ids
    )
  else:
    rows = len(
      corpus.tokenize_cached(
        sentences, template, tokenizer, MAX_SENTENCE_TOKENS, os.path.join(cache_dir, "tokens"), "alone"
      ).input_ids
    )
  seconds = time.perf_counter() - start
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10  # KiB on Linux.
  return {"phase": phase, "rows": rows, "seconds": read_seconds if phase == "read" else seconds, "peak_rss_mib": peak}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--lines", type=int, default=1_000_000)
  parser.add_argument("--tokenizer", default="bert-base-uncased", help="a folder under ../shared/tokenizers")
  parser.add_argument("--phase", help=argparse.SUPPRESS)  # Set by this script for its subprocesses.
  parser.add_argument("--corpus", help=argparse.SUPPRESS)
  parser.add_argument("--cache", help=argparse.SUPPRESS)
  args = parser.parse_args()
  print_load("start")  # The CPU model beside every number.
  tokenizer_dir = str(SHARED / "tokenizers" / args.tokenizer)
  if args.phase:
    print(json.dumps(measure(args.phase, args.corpus, tokenizer_dir, args.cache)))
    return
  work = pathlib.Path(tempfile.mkdtemp(prefix="jaxemb-tokenize-bench-"))
  try:
    corpus_file = work / "corpus.txt"
    write_corpus(corpus_file, args.lines)
    print(
      f"corpus: {args.lines:,} lines, {corpus_file.stat().st_size / 2**20:.0f} MiB; tokenizer {args.tokenizer}; "
      f"{os.cpu_count()} CPUs"
    )
    results = {}
    for phase in ("read", "cold", "warm", "reference"):
      out = subprocess.run(
        [
          sys.executable,
          __file__,
          "--tokenizer",
          args.tokenizer,
          "--phase",
          phase,
          "--corpus",
          str(corpus_file),
          "--cache",
          str(work / "cache"),
        ],
        check=True,
        capture_output=True,
        text=True,
      ).stdout
      results[phase] = json.loads(out.strip().splitlines()[-1])
      r = results[phase]
      print(f"{phase:>9}: {r['seconds']:7.1f} s  peak RSS {r['peak_rss_mib']:6.0f} MiB  ({r['rows']:,} rows)")
    cache_bytes = sum(f.stat().st_size for f in (work / "cache" / "tokens").iterdir())
    print(f"cache: {cache_bytes / 2**20:.0f} MiB in {len(list((work / 'cache' / 'tokens').iterdir()))} file(s)")
    cold, reference = results["cold"], results["reference"]
    print(
      f"cold vs reference: the reference's time / cold's {reference['seconds'] / cold['seconds']:.2f}x, peak RSS "
      f"{cold['peak_rss_mib'] / reference['peak_rss_mib']:.2f}x"
    )
  finally:
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
  main()
