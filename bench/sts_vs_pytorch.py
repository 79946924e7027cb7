r"""Full 7-task STS evaluation: jaxemb's scorer against the SentEval-style loop with HF PyTorch.

The PyTorch side is SimCSE's fork of SentEval written out: each subset's pairs sorted by length, batches of
128, both sides of every pair encoded (repeats included), cosine per pair, then per task one Spearman over
the concatenated subsets ("all"). It prints per task the two numbers and their difference, the wall times
(the two sides alternate; median of --repeats runs; jaxemb's first run includes compiling) and the speed-up,
how many sentences each side encoded, the padded / real tokens of jaxemb's length buckets and its jit
compilations. Last, static_avg: its wall time, and the matmuls in its traced computation (none: no encoder).

  python bench/sts_vs_pytorch.py --model ../shared/models/all-MiniLM-L6-v2 \
      --senteval ../shared/data/senteval --methods cls_before_pooler,last_avg,first_last_avg
"""

import argparse
import time

import common
import jax
import numpy as np
from scipy import stats
import torch
import transformers

from jaxemb import templates  # pylint: disable=g-bad-import-order
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method
from jaxemb.evaluation import sts
from jaxemb.models import Transformer
from jaxemb.testing.hf_poolings import HIDDEN_STATE_POOLINGS

BATCH = 128  # SentEval's default batch size.


def senteval_loop(model, tokenizer, method: str, tasks) -> tuple[dict[str, float], int]:
  """(task -> "all" Spearman x100, sentences encoded), the way SentEval's STS evaluation runs."""
  encoded = 0

  def embed(sentences):
    nonlocal encoded
    encoded += len(sentences)
    batch = tokenizer([sts_data.join_tokens(s) for s in sentences], padding=True, return_tensors="pt")
    with torch.no_grad():
      out = model(**batch, output_hidden_states=True)
    hidden = [h.double().numpy() for h in out.hidden_states]
    return HIDDEN_STATE_POOLINGS[method](hidden, batch["attention_mask"].double().numpy()[..., None])

  results = {}
  for task in tasks:
    system, gold = [], []
    for subset in task.subsets.values():
      pairs = sorted(
        zip(subset.sentences1, subset.sentences2, subset.scores),
        key=lambda z: (len(z[0].split()), len(z[1].split()), z[2]),
      )
      for start in range(0, len(pairs), BATCH):
        chunk = pairs[start : start + BATCH]
        a, b = embed([p[0] for p in chunk]), embed([p[1] for p in chunk])
        cosines = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        system.extend(np.nan_to_num(cosines))
        gold.extend(p[2] for p in chunk)
    results[task.name] = 100 * stats.spearmanr(system, gold).statistic
  return results, encoded


class CompileCounter:
  """Counts XLA compilations (jax's backend-compile events) and their seconds, from its creation on."""

  def __init__(self):
    self.count, self.seconds = 0, 0.0
    jax.monitoring.register_event_duration_secs_listener(self._record)

  def _record(self, event: str, seconds: float, **_):
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1
      self.seconds += seconds


def traced_matmuls(encoder: Encoder) -> int:
  """The matmuls (dot_general) in the jaxpr of the encoder's per-batch computation, nested jaxprs included."""
  batch = templates.tokenize_sentences(encoder.template, encoder.tokenizer, ["a sentence ."])
  vectors = lambda params, batch: encoder.method.vectors(
    Transformer(encoder.config), params, batch, template=encoder.template
  )
  jaxpr = jax.make_jaxpr(vectors)(encoder.params, batch)

  def count(jaxpr) -> int:
    inner = [p for eqn in jaxpr.eqns for p in eqn.params.values() if hasattr(p, "eqns") or hasattr(p, "jaxpr")]
    return sum(eqn.primitive.name == "dot_general" for eqn in jaxpr.eqns) + sum(
      count(getattr(p, "jaxpr", p)) for p in inner
    )

  return count(jaxpr.jaxpr)


def _time_static(model: str, tasks) -> None:
  """static_avg's STS run: no encoder runs (the traced computation holds no matmul)."""
  static = Encoder.from_pretrained(model, Method("static_avg"), batch_size=BATCH)
  start = time.perf_counter()
  result = sts.evaluate_sts(static.encode, tasks)
  seconds = time.perf_counter() - start
  print(
    f"\n== static_avg: {seconds:.1f} s wall (Avg. {result.average:.2f}); matmuls in the traced computation: "
    f"{traced_matmuls(static)} "
    f"(last_avg: {traced_matmuls(Encoder.from_pretrained(model, Method('last_avg')))})"
    " -- no encoder runs"
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, help="HF BERT/RoBERTa directory")
  parser.add_argument("--senteval", required=True, help="SentEval data/downstream folder")
  parser.add_argument("--methods", default="cls_before_pooler,last_avg,first_last_avg")
  parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
  parser.add_argument("--repeats", type=int, default=1, help="runs per side (median); the sides alternate")
  args = parser.parse_args()
  if args.threads:
    torch.set_num_threads(args.threads)
  common.print_load("start")
  tasks = sts_data.load_sts_tasks(args.senteval)
  model = transformers.AutoModel.from_pretrained(args.model).eval()
  tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
  compiles = CompileCounter()
  for name in args.methods.split(","):
    encoder = Encoder.from_pretrained(args.model, Method(name), batch_size=BATCH)
    compiled_before = (compiles.count, compiles.seconds)
    results, encoded = {}, {}

    jaxemb_runs = []  # Seconds of each jaxemb run: the first compiles every bucket shape.

    def ours():
      encoded["jaxemb"] = 0
      start = time.perf_counter()
      embed = lambda sentences: encoder.encode(sentences, progress=count_jaxemb)
      results["jaxemb"] = sts.evaluate_sts(embed, tasks)
      jaxemb_runs.append(time.perf_counter() - start)

    def count_jaxemb(n):
      encoded["jaxemb"] += n

    def theirs():
      results["pytorch"], encoded["pytorch"] = senteval_loop(model, tokenizer, name, tasks)

    seconds = common.interleaved({"jaxemb": ours, "pytorch": theirs}, args.repeats, warmup=0)
    print(f"\n== {name}")
    print(f"{'task':<16} {'jaxemb':>8} {'pytorch':>8} {'diff':>7}")
    for task in tasks:
      a, b = results["jaxemb"][task.name].all, results["pytorch"][task.name]
      print(f"{task.name:<16} {a:8.2f} {b:8.2f} {a - b:7.3f}")
    print(f"{'Avg.':<16} {results['jaxemb'].average:8.2f} {np.mean(list(results['pytorch'].values())):8.2f}")
    print(
      f"wall time (median of {args.repeats}): jaxemb {seconds['jaxemb']:.1f} s, SentEval-style PyTorch "
      f"{seconds['pytorch']:.1f} s; speed-up {common.ratio(1 / seconds['jaxemb'], 1 / seconds['pytorch'])} "
      f"(jaxemb's first run, compiling included: {jaxemb_runs[0]:.1f} s, "
      f"{common.ratio(1 / jaxemb_runs[0], 1 / seconds['pytorch'])})"
    )
    print(
      f"sentences encoded per run: jaxemb {encoded['jaxemb']} (each distinct sentence once), "
      f"PyTorch {encoded['pytorch']} (both sides of every pair)"
    )
    print(
      f"jaxemb buckets: padded / real tokens {encoder.padded_tokens / encoder.real_tokens:.3f} (length multiple "
      f"{encoder.length_multiple}), {encoder.compilations} compiled shapes, {compiles.count - compiled_before[0]} "
      f"jit compilations ({compiles.seconds - compiled_before[1]:.1f} s)"
    )
  _time_static(args.model, tasks)
  common.print_load("end")


if __name__ == "__main__":
  main()
