r"""The accelerator benchmark: jaxemb against HF PyTorch on whatever device JAX sees (a GPU, or the CPU).

One command, four sections, each printed as a table with the reference it is measured against:

1. forward: the encoder's last hidden state, jaxemb float32 and bfloat16 against HF PyTorch (SDPA attention)
   float32 and under autocast bfloat16 and float16, on the same weights and device; sentences/s and model FLOP
   utilisation against this device's matmul peak, measured here (jax's and torch's large matmuls, the faster).
2. train: one training step at the paper's batch (256) for PromptBERT (two views + position-offset rows),
   SimCSE and CoT-BERT: jaxemb (config.model.dtype, bfloat16 by default; the step train.py compiles) against the
   authors' recipe: the transcription of their `cl_forward` in testing_support/reference_torch.py on the HF model,
   fp16 autocast with a GradScaler, torch AdamW, clipping at 1.0. Steps/s, MFU (3x the full forward FLOPs of every
   row the step encodes, as the authors' step computes them: jaxemb's last layer computes the read rows alone, so
   its MFU is of the same model work as theirs, not of the FLOPs it ran), peak device memory, and the first step's
   seconds (jaxemb's includes its compile).
3. sts: the full 7-task STS evaluation (bert-base-sized, random weights: the time, not the score), cold (compiling)
   and warm.
4. epoch: the projected wall time of one wiki1m epoch (3,906 steps at batch 256, STS-B dev every 125 steps).

bert-base is written with random weights at its real shapes (no weights can be downloaded on an accelerator
host); MiniLM is read from ../shared when it is there. Packages the machine lacks are named at the start, and
the sections that need them are skipped with the reason.

  python bench/accelerator.py                                     # the issue's settings (an H200: about 5 min)
  python bench/accelerator.py --sections train --trace /tmp/trace # + a profile of jaxemb's steps (xprof reads it)
  python bench/accelerator.py --sections train --set model.scan_unroll=12 --set model.remat_policy=full
  python bench/accelerator.py --models minilm --shapes 16x32 --train-batch 16 --train-tokens 16 \
      --settings promptbert --sts-model minilm --repeats 2        # a CPU smoke run (--no-authors: jaxemb alone)
"""

import argparse
import contextlib
import dataclasses
import importlib
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
REQUIRED = (
  "jax",
  "flax",
  "optax",
  "orbax.checkpoint",
  "ml_collections",
  "datasets",
  "transformers",
  "scipy",
  "tqdm",
  "torch",
)


def missing_packages() -> list[str]:
  missing = []
  for name in REQUIRED:
    try:
      importlib.import_module(name)
    except ImportError:
      missing.append(name)
  return missing


MISSING = missing_packages()
if MISSING:
  print(
    f"missing packages: {', '.join(MISSING)} (pip install -r requirements.txt -r requirements-test.txt); "
    "sections that need them are skipped"
  )
if "torch" in MISSING or "transformers" in MISSING or "jax" in MISSING:
  raise SystemExit("jax, torch and transformers are needed for every section")

# pylint: disable=g-import-not-at-top,wrong-import-position
import common
import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers

from jaxemb import buckets, sharding, sweep, xla
from jaxemb.models import Transformer, load_pretrained
# pylint: enable=g-import-not-at-top,wrong-import-position

SETTINGS = {  # jaxemb config -> the authors' setting in testing_support/reference_torch.py.
  "promptbert": "unsup-bert",
  "simcse": "simcse-unsup",
  "cotbert": "cot-bert",
}
WIKI1M_STEPS, EVAL_EVERY = 3906, 125  # One epoch of wiki1m at batch 256; STS-B dev every 125 steps (run.sh).


def torch_device() -> str:
  return "cuda" if jax.default_backend() == "gpu" and torch.cuda.is_available() else "cpu"


def synchronize(device: str):
  if device == "cuda":
    torch.cuda.synchronize()


def matmul_peak(n: int, repeats: int) -> dict[str, float]:
  """FLOP/s of an n x n matmul, per dtype: the faster of jax's and torch's on this device."""
  device = torch_device()
  peaks = {}
  for name, jdtype, tdtype in (("float32", jnp.float32, torch.float32), ("bfloat16", jnp.bfloat16, torch.bfloat16)):
    a = jnp.ones((n, n), jdtype)
    f = jax.jit(lambda x: x @ x)
    t = torch.ones((n, n), dtype=tdtype, device=device)

    def theirs(t=t):
      t @ t
      synchronize(device)

    times = common.interleaved({"jax": lambda: f(a).block_until_ready(), "torch": theirs}, repeats)
    peaks[name] = 2 * n**3 / min(times.values())
  return peaks


def model_flops(config, batch: int, length: int) -> float:
  return batch * buckets.row_flops(config, length)


def forward_section(models: dict[str, pathlib.Path], shapes, peaks, repeats: int):
  device = torch_device()
  print("\n## forward (last hidden state; MFU against the measured matmul peak of the dtype)\n")
  print("| model | batch x length | side | sentences/s | MFU | jaxemb bf16 vs this |")
  print("|---|---|---|---|---|---|")
  for name, path in models.items():
    config, params = load_pretrained(path)
    hf = transformers.BertModel.from_pretrained(path, add_pooling_layer=False, attn_implementation="sdpa")
    hf = hf.to(device).eval()
    for batch, length in shapes:
      ids = np.random.default_rng(0).integers(1000, config.vocab_size, (batch, length)).astype(np.int32)
      mask = np.ones_like(ids)
      cases = {}
      for dtype in ("float32", "bfloat16"):
        model = Transformer(config, dtype=dtype)  # As encode's: the dots this backend takes for the dtype.
        f = xla.jit(lambda p, i, m, model=model: model.apply({"params": p}, i, m).last_hidden_state, dtype)
        cases[f"jaxemb {dtype}"] = lambda f=f: f(params, ids, mask).block_until_ready()
      t_ids, t_mask = torch.tensor(ids, device=device, dtype=torch.long), torch.tensor(mask, device=device)
      for label, autocast in (
        ("float32", None),
        ("autocast bfloat16", torch.bfloat16),
        ("autocast float16", torch.float16),
      ):

        def theirs(autocast=autocast):
          with torch.inference_mode(), torch.autocast(device, dtype=autocast) if autocast else contextlib.nullcontext():
            hf(input_ids=t_ids, attention_mask=t_mask)
          synchronize(device)

        cases[f"PyTorch SDPA {label}"] = theirs
      times = common.interleaved(cases, repeats)
      flops = model_flops(config, batch, length)
      for side, seconds in times.items():
        peak = peaks["float32" if side.endswith("float32") else "bfloat16"]
        print(
          f"| {name} | {batch} x {length} | {side} | {batch / seconds:,.0f} | {flops / seconds / peak:.1%} | "
          f"{common.ratio(1 / times['jaxemb bfloat16'], 1 / seconds)} |"
        )


@dataclasses.dataclass
class TrainCase:
  name: str
  step: object  # () -> loss, after `steps` steps
  rows: list[tuple[int, int]]  # (rows, width) of every encoder pass of one step
  peak_memory: object  # () -> bytes or None
  steps: int = 1  # Steps per call of `step` (jaxemb's: config.train.steps_per_call, as train.py runs them).


def jax_peak_memory():
  stats = jax.devices()[0].memory_stats()
  return stats.get("peak_bytes_in_use") if stats else None


def jaxemb_train(
  name: str, model_dir: pathlib.Path, sentences, batch: int, tokens: int, dtype: str, overrides: tuple[str, ...]
) -> TrainCase:
  config = common.train_config(name, batch, tokens)
  config.model.dtype = dtype
  # e.g. model.scan_unroll=12: what to try on a device without editing code, parsed and checked as sweep.py's.
  sweep.apply_overrides(config, {k: v for item in overrides for k, v in sweep.parse_overrides(item).items()}, "--set")
  if config.objective.loss_group_size:  # CoT-BERT's two DataParallel replicas, at any batch.
    config.objective.loss_group_size = batch // 2
  step = common.JaxembTrainStep(config, model_dir, sentences, sharding.make_mesh(-1, 1))
  o = step.objective
  rows = [tuple(step.rows[v].input_ids.shape) for v in o.views]  # SimCSE encodes its one field twice.
  tables = {t: step.rows[v].input_ids.shape[1] - t.num_tokens for v, t in zip(o.views, o.view_templates)}
  if o.denoise != "none":  # One bias table per template, a row per length 0..max_len (objectives.py).
    for template, max_len in tables.items():  # [PAD] rows hold the lengths' [PAD]s; position-offset rows do not.
      rows.append((max_len + 1, template.num_tokens + (max_len if o.denoise == "pad" else 0)))
  return TrainCase(f"jaxemb {dtype}", step, rows, jax_peak_memory, step.steps_per_call)


def authors_train(name: str, model_dir: pathlib.Path, sentences) -> TrainCase:
  """The authors' step: their cl_forward (transcribed), fp16 autocast + GradScaler, AdamW, clipping at 1.0."""
  from testing_support import reference_torch  # pylint: disable=g-import-not-at-top

  device = torch_device()
  with torch.device(device):  # The transcription makes its index tensors with torch's defaults.
    model = reference_torch.ReferenceModel(SETTINGS[name], model_dir, dropout=None, attn_implementation="sdpa")
  model = model.to(device).train()
  batch = {k: v.to(device) for k, v in model.prepare(sentences).items()}
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
  scaler = torch.amp.GradScaler(device)

  def step():
    with torch.device(device), torch.autocast(device, dtype=torch.float16):
      loss = model.loss(batch)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    synchronize(device)
    return loss

  peak = (lambda: torch.cuda.max_memory_allocated()) if device == "cuda" else (lambda: None)
  return TrainCase("authors' PyTorch fp16", step, [], peak)


def train_section(
  model_dir: pathlib.Path,
  settings,
  batch: int,
  tokens: int,
  dtype: str,
  peaks,
  repeats: int,
  trace_dir: str = "",
  overrides: tuple[str, ...] = (),
  authors: bool = True,
):
  print(
    f"\n## train step (global batch {batch}, sentences up to {tokens} tokens; MFU = 3 x full forward FLOPs "
    f"of every encoded row / step time / matmul peak){'; jaxemb with ' + ', '.join(overrides) if overrides else ''}\n"
  )
  print("| setting | side | steps/s | MFU | peak device memory | first step | jaxemb vs this |")
  print("|---|---|---|---|---|---|---|")
  config, _ = load_pretrained(model_dir)
  sentences = common.wiki_sentences(batch)
  steps_per_second = {}
  for name in settings:
    ours = jaxemb_train(name, model_dir, sentences, batch, tokens, dtype, overrides)
    cases = [ours]
    try:
      cases += [authors_train(name, model_dir, sentences)] if authors else []
    except Exception as e:  # pylint: disable=broad-except  # A missing setting or device: say so, keep going.
      print(f"| {name} | authors' PyTorch fp16 | skipped: {type(e).__name__}: {e} | | | | |")
    first = {c.name: common.seconds(c.step) for c in cases}  # What a run waits for: compiles, autotuning.
    calls = common.interleaved({c.name: c.step for c in cases}, repeats, warmup=0)
    times = {c.name: calls[c.name] / c.steps for c in cases}
    flops = 3 * sum(model_flops(config, rows, width) for rows, width in ours.rows)
    peak = peaks["bfloat16" if dtype == "bfloat16" else "float32"]
    for case in cases:
      memory = case.peak_memory()
      print(
        f"| {name} | {case.name} | {1 / times[case.name]:.2f} | "
        f"{flops / times[case.name] / peak:.1%}{' (same FLOPs)' if case is not ours else ''} | "
        f"{'n/a' if memory is None else f'{memory / 2**30:.1f} GiB'} | {first[case.name]:.1f} s | "
        f"{common.ratio(1 / times[ours.name], 1 / times[case.name])} |"
      )
    steps_per_second[name] = 1 / times[ours.name]
    if trace_dir:  # Two more of jaxemb's steps under the profiler: where a step's time goes, op by op.
      with jax.profiler.trace(str(pathlib.Path(trace_dir) / name)):
        for _ in range(2):
          ours.step()
  return steps_per_second


def sts_section(model_dir: pathlib.Path, senteval: pathlib.Path, dtype: str) -> float:
  from jaxemb.data import sts as sts_data  # pylint: disable=g-import-not-at-top
  from jaxemb.encode import Encoder, Method
  from jaxemb.evaluation import sts

  print(f"\n## full 7-task STS evaluation ({model_dir.name}, [MASK] of the PromptBERT template, {dtype})\n")
  tasks = sts_data.load_sts_tasks(senteval)
  dev = sts_data.load_sts_task(senteval, "STSBenchmark", "dev")
  encoder = Encoder.from_pretrained(
    model_dir,
    Method("prompt", template='This sentence : "[X]" means [MASK] .'),
    dtype=getattr(jnp, dtype),
    batch_size=128,
  )
  for label in ("cold (compiling)", "warm"):
    start = time.perf_counter()
    sts.evaluate_sts(encoder.encode, tasks)
    print(f"- {label}: {time.perf_counter() - start:.1f} s ({encoder.compilations} shapes)")
  start = time.perf_counter()
  sts.evaluate_sts(encoder.encode, [dev])
  dev_seconds = time.perf_counter() - start
  print(f"- STS-B dev alone, warm: {dev_seconds:.1f} s ({encoder.compilations} shapes)")
  return dev_seconds


def _arguments() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--models", default="bert-base,minilm", help="forward: bert-base, minilm, or HF folders")
  parser.add_argument("--shapes", default="128x32,128x64", help="forward: batch x length, comma-separated")
  parser.add_argument("--train-model", default="bert-base")
  parser.add_argument("--settings", default="promptbert,simcse,cotbert", help=f"train: of {sorted(SETTINGS)}")
  parser.add_argument("--train-batch", type=int, default=256)
  parser.add_argument("--train-tokens", type=int, default=32, help="data.max_sentence_tokens")
  parser.add_argument("--dtype", default="bfloat16", help="jaxemb's config.model.dtype in train and sts")
  parser.add_argument("--sts-model", default="bert-base")
  parser.add_argument("--senteval", default=str(common.SHARED / "data" / "senteval"))
  parser.add_argument("--sections", default="forward,train,sts", help="which to run (epoch needs train and sts)")
  parser.add_argument("--matmul", type=int, default=0, help="matmul size for the peak (0: 8192, 2048 on the CPU)")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--trace", default="", help="train: write a jax.profiler trace of jaxemb's steps here")
  parser.add_argument(
    "--authors",
    action=argparse.BooleanOptionalAction,
    default=True,
    help="train: time the authors' step beside jaxemb's (--no-authors: jaxemb's alone; their fp16 step takes minutes "
    "on a CPU)",
  )
  parser.add_argument(
    "--set",
    action="append",
    default=[],
    metavar="SECTION.FIELD=VALUE",
    help="train: a config field of jaxemb's step, e.g. model.scan_unroll=12 (repeatable)",
  )
  return parser.parse_args()


def _print_epoch(steps: dict[str, float], dev_seconds: float) -> None:
  """One wiki1m epoch, projected from the measured step rates and STS-B dev evaluation time."""
  print(
    f"\n## one wiki1m epoch, projected ({WIKI1M_STEPS} steps at batch 256 + "
    f"{WIKI1M_STEPS // EVAL_EVERY} STS-B dev evaluations; valid at --train-batch 256)\n"
  )
  for name, rate in steps.items():
    total = WIKI1M_STEPS / rate + WIKI1M_STEPS // EVAL_EVERY * dev_seconds
    print(
      f"- {name}: {total / 60:.1f} min ({WIKI1M_STEPS / rate / 60:.1f} training, "
      f"{WIKI1M_STEPS // EVAL_EVERY * dev_seconds / 60:.1f} STS-B dev)"
    )


def main():
  args = _arguments()
  common.print_load("start")  # The CPU model beside every number.
  sections = args.sections.split(",")
  device = jax.devices()[0]
  print(
    f"# jaxemb accelerator bench, {time.strftime('%Y-%m-%d')}: {device.platform} {device.device_kind} "
    f"x{jax.device_count()}; jax {jax.__version__}, torch {torch.__version__} ({torch_device()}), "
    f"transformers {transformers.__version__}"
  )
  n = args.matmul or (2048 if jax.default_backend() == "cpu" else 8192)
  peaks = matmul_peak(n, args.repeats)
  print("matmul peak (" + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in peaks.items()) + f"; {n}x{n})")
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    paths = {}
    path = lambda name: paths.setdefault(name, common.model_dir(name, tmp))
    if "forward" in sections:
      shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
      forward_section({m: path(m) for m in args.models.split(",")}, shapes, peaks, args.repeats)
    steps = dev_seconds = None
    if "train" in sections:
      steps = train_section(
        path(args.train_model),
        args.settings.split(","),
        args.train_batch,
        args.train_tokens,
        args.dtype,
        peaks,
        args.repeats,
        args.trace,
        tuple(args.set),
        args.authors,
      )
    if "sts" in sections:
      dev_seconds = sts_section(path(args.sts_model), pathlib.Path(args.senteval), args.dtype)
    if steps and dev_seconds is not None:
      _print_epoch(steps, dev_seconds)


if __name__ == "__main__":
  main()
