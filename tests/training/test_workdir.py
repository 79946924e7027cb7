"""jaxemb.training.workdir: the workdir lock (one process at a time) and the run fingerprint (one command a run)."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from configs import promptbert
from jaxemb.errors import WorkdirError
from jaxemb.models import run_dir
from jaxemb.training import loop, workdir
from tests.support import REPO, shared_path
from tests.support import tiny_config


def _config(tmp_path, **fields):
  """configs/promptbert.py with local paths; `fields` by dotted name."""
  config = promptbert.get_config()
  config.workdir = str(tmp_path / "run")
  config.model.path = str(tmp_path)
  for key, value in fields.items():
    section, field = key.split(".")
    config[section][field] = value
  return config


def _save_a_step(run):
  (run.checkpoints_dir / "2").mkdir(parents=True)


def test_a_second_holder_is_refused_naming_pid_host_and_lock_file_and_release_frees_it(tmp_path):
  run = run_dir.RunDir(tmp_path)
  said = []
  with workdir.lock(run, said.append):
    assert json.loads(run.lock_file.read_text()) == {"pid": os.getpid(), "host": socket.gethostname()}
    with pytest.raises(WorkdirError) as refused:
      with workdir.lock(run, said.append):
        pass
  assert str(refused.value).startswith(
    f"{tmp_path} is in use by pid {os.getpid()} on host {socket.gethostname()} (lock {run.lock_file})"
  )
  assert run.lock_file.read_text() == ""  # Released: emptied, so the next holder takes it without a word.
  with workdir.lock(run, said.append):
    pass
  assert said == []


def test_a_stale_lock_of_a_dead_process_is_taken_over_with_one_line(tmp_path):
  run = run_dir.RunDir(tmp_path)
  run.lock_file.write_text(json.dumps({"pid": 999999, "host": "old-host"}))
  said = []
  with workdir.lock(run, said.append):
    assert json.loads(run.lock_file.read_text())["pid"] == os.getpid()
  assert said == [f"took over {run.lock_file} from pid 999999 on host old-host, which ended without releasing it"]


def test_claims_in_turn_succeed_and_a_nested_claim_is_refused(tmp_path):
  """A sweep trains its runs one after another in one process: each claim is released when its run ends."""
  config = _config(tmp_path)
  for _ in range(2):
    with workdir.claim_workdir(config, say=print) as run:
      with pytest.raises(WorkdirError, match="is in use by pid"):
        with workdir.claim_workdir(config, say=print):
          pass
  assert json.loads(run.fingerprint_file.read_text())["fields"] == workdir.fingerprint(config)


def test_fingerprint_leaves_out_what_does_not_change_the_result_and_resolves_paths(tmp_path, monkeypatch):
  tmp_path = tmp_path.resolve()
  # Away from the repository, whose data/senteval (after README's prepare.py) would resolve the default's path.
  monkeypatch.chdir(tmp_path)
  config = _config(tmp_path)
  fields = workdir.fingerprint(config)
  assert {
    "model.path",
    "data.train_file",
    "objective.templates",
    "train.learning_rate",
    "train.batch_size",
    "train.seed",
    "train.num_steps",
    "method.template",
    "model.dtype",
  } <= fields.keys()
  assert not any(
    key.startswith(("workdir", "train.distributed", "train.mesh")) or key.startswith("evals") for key in fields
  )
  assert fields["objective.templates"] == list(config.objective.templates)
  monkeypatch.chdir(tmp_path.parent)
  moved = _config(tmp_path, **{"train.keep_checkpoints": 9, "train.mesh_fsdp": 2, "eval.progress": False})
  moved.evals.stsb_dev.every = 7
  moved.workdir = "elsewhere"
  moved.model.path = tmp_path.name  # The same directory, relative to the current one.
  assert workdir.fingerprint(moved) == fields
  hub = _config(tmp_path)
  hub.model.path = "bert-base-uncased"  # No such local path: a hub id, kept as given.
  assert workdir.fingerprint(hub)["model.path"] == "bert-base-uncased"


def test_a_run_of_another_command_is_refused_listing_the_fields_unless_told_to_continue(tmp_path):
  tmp_path = tmp_path.resolve()  # As the fingerprint records paths.
  old = _config(tmp_path)
  run = run_dir.RunDir(old.workdir)
  said = []
  workdir.check_fingerprint(run, workdir.fingerprint(old), False, said.append)
  _save_a_step(run)
  recorded = run.fingerprint_file.read_text()
  workdir.check_fingerprint(run, workdir.fingerprint(old), False, said.append)  # The same command: resumes.
  assert said == [] and run.fingerprint_file.read_text() == recorded
  (tmp_path / "other").mkdir()
  new = _config(tmp_path, **{"train.seed": 43})
  new.model.path = str(tmp_path / "other")
  with pytest.raises(WorkdirError) as refused:
    workdir.check_fingerprint(run, workdir.fingerprint(new), False, said.append)
  message = str(refused.value)
  assert f"model.path {str(tmp_path)!r} -> {str(tmp_path / 'other')!r}; train.seed 42 -> 43." in message
  assert "--resume_changed" in message and str(run.fingerprint_file) in message
  assert run.fingerprint_file.read_text() == recorded
  workdir.check_fingerprint(run, workdir.fingerprint(new), True, said.append)
  assert said == [
    f"continuing {run.path} with changed fields: model.path {str(tmp_path)!r} -> "
    f"{str(tmp_path / 'other')!r}; train.seed 42 -> 43; recorded in {run.fingerprint_file}"
  ]
  written = json.loads(run.fingerprint_file.read_text())
  assert written["fields"] == workdir.fingerprint(new)
  assert written["changes"] == [
    {"model.path": {"from": str(tmp_path), "to": str(tmp_path / "other")}, "train.seed": {"from": 42, "to": 43}}
  ]
  workdir.check_fingerprint(run, workdir.fingerprint(new), False, said.append)  # Now the new command's run.
  assert len(said) == 1


def test_a_workdir_without_a_saved_step_is_no_run_its_fingerprint_replaced(tmp_path):
  """A run that failed before saving a step (a bad batch size) reruns with the corrected field."""
  run = run_dir.RunDir(tmp_path / "run")
  said = []
  workdir.check_fingerprint(run, workdir.fingerprint(_config(tmp_path, **{"train.batch_size": 3})), False, said.append)
  (run.best_dir / "4.orbax-checkpoint-tmp-1").mkdir(parents=True)  # A step being written is not a saved one.
  fixed = workdir.fingerprint(_config(tmp_path, **{"train.batch_size": 4}))
  workdir.check_fingerprint(run, fixed, False, said.append)
  assert json.loads(run.fingerprint_file.read_text())["fields"] == fixed and said == []
  run.fingerprint_file.unlink()
  _save_a_step(run)  # A run from before fingerprints: this command's is recorded.
  workdir.check_fingerprint(run, fixed, False, said.append)
  assert said == [f"{run.path} has no fingerprint (a run from an older jaxemb): recording this command's"]
  run.fingerprint_file.write_text("{")
  with pytest.raises(WorkdirError, match="cannot be read"):
    workdir.check_fingerprint(run, fixed, False, said.append)


def _refused_with_the_model_moved(config, model_dir, moved):
  """Points config.model.path at the same checkpoint elsewhere (preflight passes, the fingerprint differs) and
  checks loop.train refuses it, naming the old and new path."""
  moved.mkdir()
  for item in os.listdir(model_dir):
    (moved / item).symlink_to(model_dir / item)
  config.model.path = str(moved)
  with pytest.raises(
    WorkdirError, match=re.escape(f"model.path {str(model_dir.resolve())!r} -> {str(moved.resolve())!r}")
  ):
    loop.train(config)


def test_train_reruns_a_run_that_saved_no_step_and_refuses_a_changed_one_before_loading(tmp_path, tiny_bert, wiki_head):
  """loop.train checks the config, then claims the workdir: a refused config (a bad corpus path, a bad column)
  leaves no workdir; a run that claimed it and saved no step is rerun with other fields; once a step is saved,
  another model.path is refused before any weight is read."""
  config = tiny_config("promptbert", tiny_bert, tmp_path / "run", wiki_head)
  config.data.train_file = str(tmp_path / "missing.txt")
  with pytest.raises((OSError, ValueError), match="missing.txt"):
    loop.train(config)
  config.data.train_file = str(wiki_head)
  config.objective.columns = ("text", "label")
  with pytest.raises(ValueError, match="'label'"):
    loop.train(config)
  assert not (tmp_path / "run").exists()
  config.objective.columns = ("text", "text")
  config.train.seed = 7
  with workdir.claim_workdir(config, say=lambda _: None):  # A run killed before its first save.
    pass
  config.train.seed = 42
  with workdir.claim_workdir(config, say=lambda _: None):  # No step saved: not a run, its fingerprint replaced.
    pass
  _save_a_step(run_dir.RunDir(config.workdir))
  _refused_with_the_model_moved(config, tiny_bert, tmp_path / "moved")


@pytest.mark.slow
def test_train_continues_a_changed_run_when_told(tmp_path, tiny_bert, wiki_head):
  """A trained run rerun unchanged resumes; with another model.path (the same weights, elsewhere) it is refused,
  and continued with resume_changed, which records the new fields."""
  config = tiny_config("promptbert", tiny_bert, tmp_path / "run", wiki_head, num_steps=2)
  assert loop.train(config)["steps_run"] == 2
  assert loop.train(config)["steps_run"] == 0
  _refused_with_the_model_moved(config, tiny_bert, tmp_path / "moved")
  assert loop.train(config, resume_changed=True)["steps_run"] == 0
  assert workdir.fingerprint(config) == json.loads((tmp_path / "run" / "fingerprint.json").read_text())["fields"]
  assert run_dir.RunDir(tmp_path / "run").lock_file.read_text() == ""


def test_a_second_train_py_on_a_workdir_in_use_is_refused_at_once(tmp_path):
  """While one process holds the workdir, train.py refuses before loading anything, naming the holder; once the
  holder is killed, its lock file is stale and the next claim takes it over."""
  workdir_path = tmp_path / "run"
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from jaxemb.models import run_dir; "
      "from jaxemb.training import workdir; lock = workdir.lock(run_dir.RunDir(sys.argv[1]), print); "
      "lock.__enter__(); print('held', flush=True); time.sleep(600)",
      str(workdir_path),
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline() == "held\n"
    second = subprocess.run(
      [
        sys.executable,
        str(REPO / "train.py"),
        "--config",
        str(REPO / "configs" / "promptbert.py"),
        f"--config.workdir={workdir_path}",
        "--config.model.path=/nonexistent/model",
        f"--config.data.senteval_dir={shared_path('data', 'senteval')}",
        f"--config.compilation_cache_dir={tmp_path / 'xla'}",
      ],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
    assert second.returncode != 0
    assert (
      f"{workdir_path} is in use by pid {holder.pid} on host {socket.gethostname()} (lock {workdir_path / 'lock'})"
    ) in second.stderr
    assert "/nonexistent/model" not in second.stderr  # Refused before the model was looked for.
    assert sorted(os.listdir(workdir_path)) == ["lock"]
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  said = []
  with workdir.lock(run_dir.RunDir(workdir_path), said.append):
    pass
  assert said == [
    f"took over {workdir_path / 'lock'} from pid {holder.pid} on host {socket.gethostname()}, "
    "which ended without releasing it"
  ]
