"""What the benchmark scripts share: load reports, interleaved timing, the bert-base-sized random checkpoint, the
jaxemb train step as the training loop builds it.

Import it before jax and torch: it sets OMP_WAIT_POLICY (below). XLA_FLAGS must be set before it is imported
(scaling.py's workers get theirs from their environment).
"""

import importlib
import os
import pathlib
import statistics
import sys
import time
from typing import Any, Callable

REPO = pathlib.Path(__file__).resolve().parents[1]
SCHEDULE_STEPS = 10_000  # The learning-rate schedule's length in the timed train steps (either side).
# bert-base-uncased's architecture.
BERT_BASE = dict(
  vocab_size=30522,
  hidden_size=768,
  num_hidden_layers=12,
  num_attention_heads=12,
  intermediate_size=3072,
  max_position_embeddings=512,
)

# Torch's OpenMP threads spin-wait between ops by default. On a shared 2-core machine a spinning thread that
# other jobs deschedule stalls every op (MiniLM at 8x16 under load 7: 900 ms a forward instead of 50 ms), so
# the benchmarks let them sleep unless OMP_WAIT_POLICY is set; this must happen before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(REPO))
# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import numpy as np
import transformers

from jaxemb import sharding, templates, xla
from jaxemb.data import corpus
from jaxemb.models import load_pretrained, load_tokenizer
from jaxemb.training import trainer
from jaxemb.testing.checkpoints import write_random_checkpoint
from jaxemb.spec import TrainingRun
from testing_support.shared import SHARED
# pylint: enable=g-import-not-at-top,wrong-import-position

transformers.logging.set_verbosity_error()  # No load reports or progress bars between the tables.
transformers.logging.disable_progress_bar()


def print_load(when: str):
  """The CPU and its 1/5/15-minute load averages: the machine is shared and varies, so every number is read
  against them."""
  one, five, fifteen = os.getloadavg()
  print(
    f"load average ({when}): {one:.2f} {five:.2f} {fifteen:.2f} on {cpu_model()} "
    f"(OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
    f"{xla.OPTIONS_ENV}={os.environ.get(xla.OPTIONS_ENV, '')!r})",
    flush=True,
  )


# The vector and matrix extensions that decide the CPU's dot speed, by their /proc/cpuinfo flag.
_CPU_FEATURES = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx_tile": "AMX"}


def cpu_model() -> str:
  """The CPU's model name and dot-relevant extensions (/proc/cpuinfo), printed beside every timing: numbers compare
  only on one CPU, and a VM's model name can be as short as "AMD EPYC"."""
  fields = xla.cpu_info()
  flags = set(fields.get("flags", "").split())
  features = ", ".join(name for flag, name in _CPU_FEATURES.items() if flag in flags)
  return f"{fields.get('model name', 'unknown CPU')} ({features + '; ' if features else ''}{os.cpu_count()} CPUs)"


def seconds(fn: Callable[[], Any]) -> float:
  """The wall seconds of one call of `fn` (which must block until its work is done)."""
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def interleaved_rounds(cases: dict[Any, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[Any, list[float]]:
  """Seconds of each call of each case, round by round. The cases run alternately (a, b, a, b, ...) after `warmup`
  calls each, so a burst of load from other jobs hits every side alike. Each callable must block until its work is
  done."""
  for fn in cases.values():
    for _ in range(warmup):
      fn()
  times = {name: [] for name in cases}
  for _ in range(repeats):
    for name, fn in cases.items():
      times[name].append(seconds(fn))
  return times


def interleaved(cases: dict[Any, Callable[[], Any]], repeats: int, warmup: int = 1) -> dict[Any, float]:
  """Median seconds per call of each case, timed by `interleaved_rounds`."""
  return medians(interleaved_rounds(cases, repeats, warmup))


def medians(rounds: dict[Any, list[float]]) -> dict[Any, float]:
  """Each case's median of `interleaved_rounds`' seconds."""
  return {name: statistics.median(t) for name, t in rounds.items()}


def per_round_ratio(ours: list[float], theirs: list[float]) -> str:
  """The median over rounds of `theirs / ours` seconds (`ratio`'s sense) from `interleaved_rounds`: on a VM whose
  speed drifts by 10-20% within minutes the two sides of one round ran at the same speed, where the medians of
  each side may not have."""
  return f"{statistics.median(t / o for o, t in zip(ours, theirs)):.2f}x"


def ratio(ours: float, theirs: float) -> str:
  """`ours / theirs` of two rates (higher is better), as printed by every script."""
  return f"{ours / theirs:.2f}x"


MINILM = SHARED / "models" / "all-MiniLM-L6-v2"


def model_dir(name: str, tmp: pathlib.Path) -> pathlib.Path:
  """The checkpoint a --model flag names: "minilm", "bert-base" (written into `tmp`), or a HF directory."""
  if name == "bert-base":
    return write_random_checkpoint(tmp / "bert-base", "bert", head=False, init_std=None, **BERT_BASE)
  return MINILM if name == "minilm" else pathlib.Path(name)


def train_config(name: str, batch_size: int, sentence_tokens: int):
  """`configs/<name>.py` (promptbert, simcse, ...) at the benchmark's global batch and sentence length."""
  config = importlib.import_module(f"configs.{name}").get_config()
  config.train.batch_size = batch_size
  config.data.max_sentence_tokens = sentence_tokens
  return config


def wiki_sentences(count: int) -> list[str]:
  """The first `count` non-blank lines of the shared wiki1m sample (SimCSE's training text)."""
  lines = (SHARED / "data" / "wiki" / "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()
  return [line for line in lines if line.strip()][:count]


class JaxembTrainStep:
  """One jitted jaxemb train step on a fixed global batch, built by `jaxemb.training.trainer.build_trainer` as
  train.py's loop builds it: the objective from the config, the encoder plus the objective's heads, AdamW, the sharded
  and donated step.

  Calling it runs one call of `steps_per_call` steps, as train.py's loop runs them (config.train.steps_per_call,
  by default jaxemb.xla.steps_per_call's: 4 on the CPU), and returns the last step's loss; `prng_impl`
  ("threefry2x32", "rbg", "unsafe_rbg") is the default PRNG while the state is made and while the step runs (it
  draws the dropout masks).
  """

  def __init__(self, config, model_dir: pathlib.Path, sentences: list[str], mesh, prng_impl: str = "threefry2x32"):
    self.prng_impl = prng_impl
    self.model_config, pretrained = load_pretrained(model_dir)
    tokenizer = load_tokenizer(model_dir)
    with jax.default_prng_impl(prng_impl):
      run = TrainingRun.from_config(config)
      objective = trainer.build_objective(run, tokenizer)
      built = trainer.build_trainer(run, self.model_config, pretrained, objective, mesh, SCHEDULE_STEPS)
      self.state = built.initial_state(pretrained)
    self.objective, self.model, self._run = built.objective, built.model, built.run
    self.steps_per_call = built.steps_per_call
    tokens = config.data.max_sentence_tokens
    # What the loop feeds a step: corpus.tokenize_cached's rows (the template's width plus max_sentence_tokens), cut
    # to the batch's longest row rounded up to data.length_multiple.
    self.rows = {}
    for view, template in zip(self.objective.views, self.objective.view_templates):
      rows = templates.tokenize_sentences(
        template,
        tokenizer,
        sentences,
        max_sentence_tokens=tokens,
        pad_to=template.num_tokens + tokens,
        tokenization=config.data.tokenization,
      )
      width = corpus.batch_width(rows.attention_mask.sum(1), config.data.length_multiple, rows.input_ids.shape[1])
      self.rows[view] = corpus.gather(rows, np.arange(len(sentences)), width)
    self.batch = jax.device_put(self.rows, sharding.batch_sharding(mesh))
    # The step donates the state: a host copy of the starting weights for the PyTorch side and loss checks.
    self.initial_params = jax.device_get(self.state.all_params)

  def __call__(self) -> float:
    with jax.default_prng_impl(self.prng_impl):
      self.state, metrics = self._run(self.state, [self.batch] * self.steps_per_call)
      return float(metrics["loss"][-1])
