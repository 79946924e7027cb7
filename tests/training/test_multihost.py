"""Multi-host for real: two processes on 127.0.0.1 (gloo CPU collectives, two simulated devices each), each
reading its own shard of the data, end with the params of one process with four devices; their checkpoints
restore in a single process."""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxemb.models import run_dir
from tests.conftest import REPO, shared_path


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _command(model_dir, corpus_file, workdir, cache, *extra):
  return [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs" / "promptbert.py"),
          f"--config.model.path={model_dir}", f"--config.data.train_file={corpus_file}",
          f"--config.eval.senteval_dir={shared_path('data', 'senteval')}", f"--config.workdir={workdir}",
          f"--config.data.cache_dir={cache}", "--config.data.max_sentence_tokens=16",
          "--config.eval.length_multiple=64", "--config.train.batch_size=8", "--config.train.num_steps=2",
          "--config.train.save_every=2", "--config.train.eval_every=100", "--config.train.adam_eps=1e-6",
          "--config.compilation_cache_dir=", *extra]


def _env(devices):
  return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}


def _restore_params(workdir):
  """The last train state's params, restored in this single-device process whatever mesh wrote them."""
  manager = ocp.CheckpointManager(workdir / "checkpoints")
  step = manager.latest_step()
  target = run_dir.abstract_on_one_device(workdir / "checkpoints" / str(step) / "state")
  state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target)))["state"]
  manager.close()
  return state.params if hasattr(state, "params") else state["params"]


def test_two_processes_equal_one_process_with_four_devices(tmp_path, tiny_bert):
  corpus_file = tmp_path / "wiki.txt"
  lines = shared_path("data", "wiki", "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()[:64]
  corpus_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
  cache = tmp_path / "cache"
  single = subprocess.run(_command(tiny_bert, corpus_file, tmp_path / "single", cache), env=_env(4),
                          capture_output=True, text=True, check=False)
  assert single.returncode == 0, single.stderr[-3000:]
  port = _free_port()
  pair = [subprocess.Popen(
      _command(tiny_bert, corpus_file, tmp_path / "pair", cache,
               f"--config.train.distributed.coordinator_address=127.0.0.1:{port}",
               "--config.train.distributed.num_processes=2", f"--config.train.distributed.process_id={i}"),
      env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
  for process in pair:
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
  expected, got = _restore_params(tmp_path / "single"), _restore_params(tmp_path / "pair")
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(expected), jax.tree.leaves(got)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, err_msg=jax.tree_util.keystr(path))
  _, best, _ = run_dir.load_best(tmp_path / "pair")  # What evaluate.py reads, in one process.
  np.testing.assert_array_equal(best["encoder"]["layer_0"]["query"]["kernel"],
                                got["encoder"]["layer_0"]["query"]["kernel"])
