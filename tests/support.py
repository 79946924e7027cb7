"""What the tests share (the benchmarks' share is jaxemb/testing/): the ../shared folder with a skip when it is not
there, subprocesses on simulated devices, toy-scale training configs and STS jobs, the compile log, TensorBoard's
records."""

import atexit
import collections
import functools
import importlib
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import pytest

from jaxemb.testing import temp_folders
from jaxemb.testing.shared import REPO, SHARED


def python_on_devices(code: str, devices: int, *args) -> str:
  """stdout of `python -c code args` in the repository on `devices` simulated CPU devices (a subprocess: their count
  is fixed when JAX starts); asserts it succeeded."""
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run(
    [sys.executable, "-c", code, *map(str, args)], cwd=REPO, env=env, capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


# XLA's fusion emitters, which tests/conftest.py turns off for the pytest process's compiles (XLA's default: on). A
# test of the program XLA compiles for a user passes these to `Lowered.compile(compiler_options=...)`.
USERS_XLA_OPTIONS = {"xla_cpu_use_fusion_emitters": True}
# The XLA_FLAGS of the pytest process's compiles, for a subprocess that must compute as it does (bit for bit).
TEST_XLA_FLAGS = " ".join(f"--{name}={not value}".lower() for name, value in USERS_XLA_OPTIONS.items())

# jaxemb's programs that compile on every run by design (jaxemb/xla.py): the encoder's forward with oneDNN's dots,
# which XLA cannot serialize, and the probe of which compiler options this jaxlib accepts and serializes.
UNCACHED_PROGRAMS = {"jit_vectors", "jit__dot_probe"}


def compiled_not_loaded(stderr: str) -> collections.Counter:
  """The programs a process run with JAX_LOG_COMPILES=1 compiled instead of loading them from the persistent cache,
  by module name (e.g. "jit_train_steps"), from its stderr: XLA compilations minus cache hits."""
  names = re.findall(r"Finished XLA compilation of (.+?) in [\d.]+ sec", stderr)  # e.g. jit(<lambda>): jit__lambda
  compiled = collections.Counter(re.sub(r"\W", "_", name).rstrip("_") for name in names)
  hits = collections.Counter(re.findall(r"Persistent compilation cache hit for '([^']+)'", stderr))
  return compiled - hits


def shared_path(*parts: str) -> pathlib.Path:
  """A path under ../shared; skips the test when it is not there."""
  path = SHARED.joinpath(*parts)
  if not path.exists():
    pytest.skip(f"{path} is not available (set JAXEMB_SHARED)")
  return path


@functools.cache
def short_senteval() -> pathlib.Path:
  """A SentEval folder of STS-B and SICK, each file cut to its first 40 pairs, for runs that need a selection score,
  not a good one: scoring the 1,500 STS-B dev pairs took a toy run ~10 s of its ~23. One per process, removed when
  it exits; a subprocess is handed its parent's."""
  root = temp_folders.make("senteval")
  atexit.register(shutil.rmtree, root, True)
  files = {
    "STS/STSBenchmark": ("sts-dev.csv", "sts-test.csv"),
    "SICK": ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt"),
  }
  for folder, names in files.items():
    (root / folder).mkdir(parents=True)
    for name in names:  # SICK's files start with a header line.
      lines = shared_path("data", "senteval", folder, name).read_text(encoding="utf-8").splitlines(True)
      (root / folder / name).write_text("".join(lines[: 40 + (folder == "SICK")]), encoding="utf-8")
  return root


def tiny_config(name, model_dir, workdir, train_file=None, senteval_dir=None, **train):
  """The config of configs/<name>.py at toy scale: the real data samples (or `train_file`), batch 4, 4 steps, STS-B
  dev from `senteval_dir` or cut short (short_senteval)."""
  config = importlib.import_module(f"configs.{name}").get_config()
  config.model.path = str(model_dir)
  config.workdir = str(workdir)
  nli = config.data.format == "nli"
  config.data.train_file = str(
    train_file
    or (
      shared_path("data", "nli", "nli_for_simcse_sample.csv")
      if nli
      else shared_path("data", "wiki", "wiki1m_sample.txt")
    )
  )
  config.data.max_sentence_tokens = 16
  config.data.senteval_dir = str(senteval_dir or short_senteval())
  config.eval.length_multiple = 64
  config.eval.batch_size = 512  # Few encoder calls per evaluation: their overhead dominates on a tiny model.
  config.train.batch_size = 4
  config.model.scan_unroll = 1  # The CPU's default unrolls the layers: faster steps, slower compiles.
  if config.objective.loss_group_size:  # CoT-BERT's two replicas of 128 rows, at toy scale.
    config.objective.loss_group_size = 2
  config.train.num_steps = 4
  config.evals.stsb_dev.every = train.pop("eval_every", 2)  # The selection evaluator's period.
  config.train.save_every = 2
  for key, value in train.items():
    config.train[key] = value
  return config


def short_sts_job(model_dir, output_json, **method):
  """configs/eval_baselines.py's STS job on STS-B test cut short (short_senteval) with `model_dir`, the flat
  `config.method` fields `method` (name included) set, writing `output_json` (a fitted method's .npz beside it)."""
  config = importlib.import_module("configs.eval_baselines").get_config()
  for key, value in method.items():
    config.method[key] = value
  config.model.path, config.data.senteval_dir = str(model_dir), str(short_senteval())
  config.eval.tasks, config.eval.output_json = "STSBenchmark", str(output_json)
  return config


def short_stsb_test_sentences() -> list[str]:
  """The distinct sentences of short_senteval's STS-B test (its 40 pairs): 72, more than the tiny models' 32
  dimensions, as an STS job on it fits."""
  from jaxemb.data import sts as sts_data  # pylint: disable=import-outside-toplevel

  task = sts_data.load_sts_task(str(short_senteval()), "STSBenchmark", "test")
  return list(dict.fromkeys(s for subset in task.subsets.values() for s in (*subset.sentences1, *subset.sentences2)))


def tensorboard_events(directory):
  """The events of every TensorBoard file in `directory` (TFRecord: length, its crc, the event, its crc)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel

  events = []
  for path in sorted(directory.iterdir()):
    data, offset = path.read_bytes(), 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset : offset + 8])
      events.append(event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length]))
      offset += 12 + length + 4
  return events


def tensorboard_scalars(directory, tag):
  """[(step, value)] of `tag` as TensorBoard shows them: the files in order, each SessionLog.START at step s
  discarding the events at s and later read before it (a resumed run's purge_step)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel

  shown = []
  for event in tensorboard_events(directory):
    if event.session_log.status == event_pb2.SessionLog.START:
      shown = [(step, value) for step, value in shown if step < event.step]
    shown += [(event.step, value.simple_value) for value in event.summary.value if value.tag == tag]
  return shown


def final_params(workdir):
  """The params of the latest checkpoint of the run directory `workdir`."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  manager = ocp.CheckpointManager(pathlib.Path(workdir) / "checkpoints")
  restored = manager.restore(manager.latest_step(), args=ocp.args.Composite(state=ocp.args.StandardRestore()))
  manager.close()
  return restored["state"]["params"]


def logged_steps(metrics_file, scalar):
  """The steps of the records of `scalar` in a metrics.jsonl file, in file order."""
  return [r["step"] for r in map(json.loads, metrics_file.read_text().splitlines()) if scalar in r]


# Every training config file (configs/<name>.py) that trains an encoder.
TRAIN_CONFIGS = [
  "promptbert",
  "promptroberta",
  "promptbert_sup",
  "promptroberta_sup",
  "cotbert",
  "cotroberta",
  "simcse",
  "simcse_sup",
  "optiprompt",
]


def param_leaves(params) -> dict:
  """{path: array} of a params tree in the plain (HF-keyed) layout."""
  from jaxemb.models import hf_keys  # pylint: disable=import-outside-toplevel

  return dict(hf_keys._flatten(hf_keys.flax_to_plain(params)))  # pylint: disable=protected-access


def assert_same_params(a, b):
  import numpy as np  # pylint: disable=import-outside-toplevel

  a, b = param_leaves(a), param_leaves(b)
  assert a.keys() == b.keys()
  for path in a:
    np.testing.assert_array_equal(np.asarray(a[path]), np.asarray(b[path]), err_msg="/".join(path))
