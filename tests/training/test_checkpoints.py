"""RunCheckpoints: non-finite params refused (found on device, not copied to the host); runs that resume after a
kill at any stage of a save, an unreadable checkpoint (set aside, the one before restored) or a full disk."""

import gc
import logging
import os
import pathlib
import json
import re
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxemb import storage
from jaxemb.errors import DataError, StorageError
from jaxemb.models import checkpoint_files, hf, run_dir
from jaxemb.training import checkpoints, loop
from jaxemb.spec import TrainingRun
from tests.support import REPO, short_senteval
from tests.training import checkpoint_kill
from tests.training.run_support import assert_same_run, kill_driver, restore, vm_env


def test_a_nan_param_is_named_and_nothing_is_written(tmp_path):
  ckpt = checkpoints.RunCheckpoints(tmp_path, keep=2)
  params = {"encoder": {"bias": jnp.zeros(3), "kernel": jnp.ones((2, 2)).at[1, 0].set(jnp.nan)}, "mlp": jnp.ones(2)}
  with pytest.raises(FloatingPointError, match=r"non-finite params: \[\"\['encoder'\]\['kernel'\]\"\]"):
    ckpt.save_best(1, params, {"step": 1})
  params["encoder"]["kernel"] = jnp.ones((2, 2))
  params["mlp"] = jnp.array([1.0, np.inf])
  with pytest.raises(FloatingPointError, match=r"\['mlp'\]"):
    ckpt.save_best(1, params, {"step": 1})
  ckpt.wait()
  assert ckpt.best.latest_step() is None
  params["mlp"] = jnp.ones(2)
  ckpt.save_best(2, params, {"step": 2})
  ckpt.wait()
  assert ckpt.best.latest_step() == 2
  ckpt.close()


def test_a_run_killed_in_its_first_save_says_it_starts_again(tmp_path):
  """Its half-written step is removed, and with no complete checkpoint left the rerun starts from the first step:
  both said, not done silently."""
  partial = tmp_path / "checkpoints" / "1.orbax-checkpoint-tmp-1764300000"
  partial.mkdir(parents=True)
  said = []
  checkpoints.RunCheckpoints(tmp_path, keep=2, say=said.append).close()
  assert said == [
    f"removed the unfinished saves a stopped run left: {partial}",
    f"no readable checkpoint left in {tmp_path / 'checkpoints'}: starting from the first step",
  ]
  manager = ocp.CheckpointManager(tmp_path / "checkpoints")  # A complete step 1, then step 2's save interrupted.
  manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": jnp.ones(2)}), meta=ocp.args.JsonSave({})))
  manager.close()
  (tmp_path / "checkpoints" / "2.orbax-checkpoint-tmp-1764300001").mkdir()
  said.clear()
  checkpoints.RunCheckpoints(tmp_path, keep=2, say=said.append).close()
  assert len(said) == 1 and said[0].startswith("removed the unfinished saves")  # It resumes from step 1.


def test_finiteness_is_one_small_replicated_vector():
  flags = checkpoints._finite_leaves({"a": jnp.ones((4, 4)), "b": jnp.array([0.0, -jnp.inf])})  # pylint: disable=protected-access
  assert isinstance(flags, jax.Array) and flags.shape == (2,)
  np.testing.assert_array_equal(np.asarray(flags), [True, False])


# A whole tiny run, and runs killed at each stage of a save (tests/training/checkpoint_kill.py) and run again. Each
# subprocess costs ~20-40 s: CI runs the reference and two stages, "after best" (the best save of step 2 committed,
# its periodic save not: the rerun from step 1 scores step 2 again and finds it saved) and "during periodic" (a
# half-written step left in its temporary folder); the other four stages run with -m slow.
_KILLS_IN_CI = ("after best", "during periodic")


@pytest.mark.e2e
@pytest.mark.parametrize(
  "stage", [s if s in _KILLS_IN_CI else pytest.param(s, marks=pytest.mark.slow) for s in checkpoint_kill.STAGES]
)
def test_a_kill_at_any_stage_of_a_save_resumes_to_the_uninterrupted_run(
  stage, whole_run, tiny_bert, wiki_head, tmp_path
):
  whole, xla_cache = whole_run
  killed = kill_driver(tiny_bert, tmp_path / "run", wiki_head, xla_cache, stage)
  assert killed.returncode == checkpoint_kill.KILLED, killed.stderr
  if stage.startswith("during"):
    assert list((tmp_path / "run").glob("*/*.orbax-checkpoint-tmp*")), "the kill left no half-written step"
  rerun = kill_driver(tiny_bert, tmp_path / "run", wiki_head, xla_cache, "none")
  assert rerun.returncode == 0, rerun.stderr
  if stage.startswith("during"):
    assert "removed the unfinished saves a stopped run left" in rerun.stdout
  assert not list((tmp_path / "run").glob("*/*.orbax-checkpoint-tmp*"))
  assert "Traceback" not in rerun.stderr
  assert_same_run(whole, tmp_path / "run")


@pytest.mark.e2e
def test_a_run_in_a_bucket_killed_after_a_save_resumes_on_a_new_vm_and_is_evaluated_from_it(
  whole_run, tiny_bert, wiki_head, bucket, tmp_path
):
  """The bucket issue's scenario on a real GCS emulator: the run directory, the model, the corpus and STS-B in a
  bucket. Killed as the save of step 2 commits (its lease left behind), the same command on a new VM (another
  working directory and HOME: an empty download cache) takes the run over and ends as the uninterrupted local run,
  once a rerun on the corpus with its lines shuffled has been refused; evaluate.py scores its best step from the
  bucket. No local `gs:` folder appears anywhere."""
  whole, xla_cache = whole_run
  model, corpus, senteval, run = (
    f"{bucket}/{key}" for key in ("models/tiny", "data/wiki_head.txt", "senteval", "runs/r1")
  )
  storage.upload(tiny_bert, model)
  storage.upload(wiki_head, corpus)
  storage.upload(short_senteval() / "STS" / "STSBenchmark", f"{senteval}/STS/STSBenchmark")  # whole_run's.
  killed = kill_driver(model, run, corpus, xla_cache, "after periodic", senteval, vm=tmp_path / "vm1")
  assert killed.returncode == checkpoint_kill.KILLED, killed.stderr
  refused = _refused_on_a_shuffled_corpus(wiki_head, model, run, corpus, xla_cache, senteval, tmp_path / "vm2")
  # The same host name (another HOME, one machine): its pid gone, the lease is taken over at once.
  assert re.search(rf"^took over {run}/lock from pid \d+ on host \S+, which is no longer running$", refused, re.M)
  rerun = kill_driver(model, run, corpus, xla_cache, "none", senteval, vm=tmp_path / "vm2")
  assert rerun.returncode == 0, rerun.stderr
  assert f"resumed from {run}/checkpoints at step 2" in rerun.stdout
  assert "Traceback" not in rerun.stderr
  assert_same_run(whole, storage.path(run))
  events = list((storage.path(run) / "tensorboard").iterdir())  # One file an attempt, uploaded whole.
  assert len(events) == 2 and all(event.stat().length for event in events), events

  vm3 = tmp_path / "vm3"
  evaluated = subprocess.run(
    [
      sys.executable,
      str(REPO / "evaluate.py"),
      "--config",
      str(REPO / "configs" / "eval_prompt.py"),
      f"--config.model.path={run}",
      f"--config.data.senteval_dir={senteval}",
      "--config.eval.tasks=STSBenchmark",
      f"--config.compilation_cache_dir={xla_cache}",
      f"--config.eval.output_json={run}/eval.json",
    ],
    cwd=vm3,
    env=vm_env(vm3),
    capture_output=True,
    text=True,
    check=False,
  )
  assert evaluated.returncode == 0, evaluated.stderr
  assert re.search(r"\| STSBenchmark +\| test +\| +-?\d+\.\d\d", evaluated.stdout), evaluated.stdout
  assert json.loads(storage.path(f"{run}/eval.json").read_text())
  for folder in (tmp_path / "vm1", tmp_path / "vm2", vm3, REPO):
    assert not list(folder.glob("gs:*")) and not list(folder.glob("*/gs:*")), folder


def _refused_on_a_shuffled_corpus(wiki_head, model, run, corpus, xla_cache, senteval, vm) -> str:
  """The data issue's case: the corpus object replaced by its own lines in another order (the same size) before the
  rerun, which is refused in one line naming it; the same bytes then uploaded again (a new generation) are the
  run's corpus. The refused rerun's stdout."""
  storage.path(corpus).write_text("".join(reversed(wiki_head.read_text().splitlines(keepends=True))))
  refused = kill_driver(model, run, corpus, xla_cache, "none", senteval, vm=vm)
  assert refused.returncode == 1, refused.stderr
  then_now = r"([\d,]+) bytes, md5 [0-9a-f]{12}, generation \d+ -> \1 bytes, md5 [0-9a-f]{12}, generation \d+"
  assert re.search(
    re.escape(f"WorkdirError: {run} holds a run started on other data ({run}/fingerprint.json): {corpus} ")
    + re.escape("(config.data.train_file) ")
    + then_now
    + re.escape(". Restore the files it started with, choose another --config.workdir, or pass train.py ")
    + re.escape("--resume_changed to continue it on these\n"),
    refused.stderr,
  ), refused.stderr
  storage.upload(wiki_head, corpus)
  return refused.stdout


def _largest_data_file(item_dir):
  """The largest of an item's OCDBT data files (the arrays' chunks; their metadata sits in a small file)."""
  return max(item_dir.glob("**/d/*"), key=lambda p: p.stat().st_size)


def _truncate_a_data_file(step_dir):
  data = _largest_data_file(step_dir / "state")
  data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
  return f"OUT_OF_RANGE reading {step_dir / 'state'}/: Requested byte range"


def _delete_a_data_file(step_dir):
  data = _largest_data_file(step_dir / "state")
  data.unlink()
  return f" reading {step_dir / 'state'}/: "


def _garble_array_bytes(step_dir, item="state"):
  """Four bytes in the middle of the largest data file inverted, its size kept: OCDBT reads them back as other
  values without a word, so only the digest saved in the meta tells."""
  data = _largest_data_file(step_dir / item)
  garbled = bytearray(data.read_bytes())
  middle = len(garbled) // 2
  garbled[middle : middle + 4] = bytes(b ^ 0xFF for b in garbled[middle : middle + 4])
  data.write_bytes(bytes(garbled))
  return "its arrays differ from the digest saved with them: a file was changed after the save"


def _garble_the_meta(step_dir):
  (step_dir / "meta" / "metadata").write_text('{"best_stsb_dev": 24.')
  return f"{step_dir / 'meta'}: Expecting"


def _remove_the_commit_marker(step_dir):
  (step_dir / "commit_success.txt").unlink()
  return "no commit_success.txt: its save never finished"


@pytest.mark.e2e
@pytest.mark.parametrize(
  "corrupt",
  [_truncate_a_data_file, _delete_a_data_file, _garble_array_bytes, _garble_the_meta, _remove_the_commit_marker],
)
def test_an_unreadable_checkpoint_is_named_set_aside_and_the_one_before_restored(corrupt, whole_run, tmp_path):
  whole, _ = whole_run
  shutil.copytree(whole, tmp_path / "run")
  cause = corrupt(tmp_path / "run" / "checkpoints" / "3")
  said = []
  ckpt = checkpoints.RunCheckpoints(tmp_path / "run", keep=2, say=said.append)
  abstract = run_dir.abstract_on_one_device(whole / "checkpoints" / "2" / "state")
  state, meta = ckpt.restore(abstract)
  ckpt.close()
  (line,) = said
  assert line.startswith(f"checkpoint {tmp_path / 'run' / 'checkpoints' / '3'} is unreadable (") and cause in line
  (aside,) = (tmp_path / "run" / "checkpoints").glob("corrupt-3-*")
  assert line.endswith(f"set aside as {aside.name}") and sorted(os.listdir(aside)) != []
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", aside.name]
  _, expected = restore(whole / "checkpoints", 2)
  saved_meta = checkpoint_files.without_digest(expected["meta"])
  assert saved_meta.pop(run_dir.FINGERPRINT_COPY) == json.loads((whole / "fingerprint.json").read_text())
  assert saved_meta.pop(run_dir.MODEL_CONFIG_COPY) == json.loads((whole / "model" / "config.json").read_text())
  assert saved_meta.pop(run_dir.MODEL_DIGESTS_COPY) == run_dir.model_digests(run_dir.RunDir(whole))
  assert meta == saved_meta and "arrays_digest" in expected["meta"]
  for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(expected["state"]), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.e2e
def test_a_garbled_model_config_is_written_again_from_the_checkpoints_copy(
  whole_run, tiny_bert, wiki_head, tmp_path, capsys
):
  """The run's model/config.json garbled on disk: the rerun (of the finished run: no step left) writes it again,
  byte for byte, from the copy the newest checkpoint keeps, where train.py's resume and evaluate.py stopped."""
  whole, _ = whole_run
  shutil.copytree(whole, tmp_path / "run")
  config_file = tmp_path / "run" / "model" / "config.json"
  config_file.write_text('{"architectures": ["Be')
  loop.train(TrainingRun.from_config(checkpoint_kill.kill_config(tiny_bert, tmp_path / "run", wiki_head, "")))
  said = capsys.readouterr().out
  assert (
    f"{tmp_path}/run/model: config.json changed on disk since {tmp_path}/run/checkpoints/3 was saved: written again "
    "as the run wrote them at its start\n"
  ) in said
  assert said.endswith("); no step left to run (the run had reached its 3)\n"), said
  assert config_file.read_bytes() == (whole / "model" / "config.json").read_bytes()
  assert run_dir.load_best(tmp_path / "run")[0] == run_dir.load_best(whole)[0]


@pytest.mark.e2e
def test_model_files_changed_on_disk_are_written_again_as_the_run_wrote_them(
  whole_run, tiny_bert, wiki_head, tmp_path, capsys, caplog
):
  """Files of the run's model/ that still read but hold other bytes (a digit of config.json, a word of the
  vocabulary) or are gone (eval_method.json): the rerun finds them by the digests the newest checkpoint keeps and
  writes them again, byte for byte."""
  whole, _ = whole_run
  shutil.copytree(whole, tmp_path / "run")
  model = tmp_path / "run" / "model"
  config = model / "config.json"
  config.write_text(config.read_text().replace('"num_attention_heads": 4', '"num_attention_heads": 2'))
  tokenizer = model / "tokenizer.json"
  tokenizer.write_text(tokenizer.read_text(encoding="utf-8").replace('"the":', '"thf":', 1), encoding="utf-8")
  (model / "eval_method.json").unlink()
  changed = f"{model}: config.json, eval_method.json, tokenizer.json changed on disk since {tmp_path}/run/checkpoints/3"
  run_dir.open_source(tmp_path / "run")  # What encoding and export open: said, not refused.
  assert f"{changed} was saved: the run's train.py command, run again, writes them again" in caplog.text
  loop.train(TrainingRun.from_config(checkpoint_kill.kill_config(tiny_bert, tmp_path / "run", wiki_head, "")))
  said = capsys.readouterr().out
  assert f"{changed} was saved: written again as the run wrote them at its start\n" in said, said
  for file in (whole / "model").iterdir():
    assert (model / file.name).read_bytes() == file.read_bytes(), file.name


def test_a_model_config_in_a_bucket_is_written_again_there(bucket, tiny_bert, tmp_path, monkeypatch):
  """The tokenizer files too: saved by a library that writes local folders only, uploaded beside the config."""
  monkeypatch.chdir(tmp_path)  # Where a gs:// path taken for a local one would land.
  copy = json.loads((tiny_bert / "config.json").read_text())
  digests = {"config.json": "0" * 64, "tokenizer.json": "0" * 64}  # Both gone from model/.
  meta = {run_dir.MODEL_CONFIG_COPY: copy, run_dir.MODEL_DIGESTS_COPY: digests}
  storage.path(f"{bucket}/run/checkpoints/3/meta/metadata").write_text(json.dumps(meta))
  run = run_dir.RunDir(f"{bucket}/run")
  loop._run_model_config(run, hf.load_tokenizer(tiny_bert), {})  # pylint: disable=protected-access
  written = {path.name for path in storage.path(f"{bucket}/run/model").iterdir()}
  assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= written, written
  assert json.loads(storage.path(f"{bucket}/run/model/config.json").read_text()) == copy
  assert not list(tmp_path.iterdir())


@pytest.mark.e2e
def test_with_every_checkpoint_unreadable_the_run_starts_again_and_says_so(whole_run, tmp_path):
  whole, _ = whole_run
  shutil.copytree(whole, tmp_path / "run")
  _truncate_a_data_file(tmp_path / "run" / "checkpoints" / "2")
  _garble_the_meta(tmp_path / "run" / "checkpoints" / "3")
  said = []
  ckpt = checkpoints.RunCheckpoints(tmp_path / "run", keep=2, say=said.append)
  if ckpt.latest_step() is not None:  # As the loop does: found unreadable when its arrays are read.
    assert ckpt.restore(run_dir.abstract_on_one_device(whole / "checkpoints" / "2" / "state")) is None
  ckpt.close()
  assert len(said) == 3 and said[-1] == (
    f"no readable checkpoint left in {tmp_path / 'run' / 'checkpoints'}: starting from the first step"
  )
  assert len(list((tmp_path / "run" / "checkpoints").glob("corrupt-*"))) == 2


@pytest.mark.e2e
def test_a_failed_read_leaves_nothing_to_print_but_its_one_line(whole_run, tmp_path, monkeypatch, caplog):
  """The reads still in flight when one read fails are cancelled and awaited
  (checkpoint_files.quiet_orbax_failures), not left on the event loop Orbax closes, where Python and asyncio printed
  a traceback of each read's coroutine or unretrieved exception. Whether reads are in flight then is a matter of
  timing (about one try in two cut the largest data file short so): the damaged checkpoint is read several times."""
  whole, _ = whole_run
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", unraisable.append)  # What Python would print, kept.
  abstract = run_dir.abstract_on_one_device(whole / "checkpoints" / "3" / "state")
  for attempt in range(10):
    step_dir = tmp_path / str(attempt) / "checkpoints" / "3"
    shutil.copytree(whole / "checkpoints" / "3", step_dir)
    data = _largest_data_file(step_dir / "state")
    data.write_bytes(data.read_bytes()[:10])
    ckpt = checkpoints.RunCheckpoints(step_dir.parent.parent, keep=2, say=lambda _: None)
    assert ckpt.restore(abstract) is None
    ckpt.close()
  time.sleep(1)  # TensorStore completes in its own threads the reads a failure left.
  gc.collect()
  assert not unraisable, [f"{u.object!r}: {type(u.exc_value).__name__}" for u in unraisable]
  assert not [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.e2e
@pytest.mark.parametrize("corrupt", [_truncate_a_data_file, _garble_array_bytes, _garble_the_meta])
def test_an_unreadable_best_step_is_one_data_error_naming_it(corrupt, whole_run, tmp_path, caplog):
  whole, _ = whole_run
  shutil.copytree(whole, tmp_path / "run")
  (best,) = (tmp_path / "run" / "best").iterdir()
  cause = ".*"
  if corrupt is _truncate_a_data_file:
    data = _largest_data_file(best / "params")
    data.write_bytes(data.read_bytes()[:10])
  elif corrupt is _garble_array_bytes:
    cause = re.escape(corrupt(best, "params"))
  else:
    corrupt(best)
  with pytest.raises(DataError, match=f"^best checkpoint {re.escape(str(best))} is unreadable: {cause}; restore it"):
    run_dir.load_best(tmp_path / "run")
  assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # The error alone.


def _cut_short_its_best_step(whole, run, kept_checkpoints) -> pathlib.Path:
  """A copy of the uninterrupted run in `run` with only the periodic checkpoints `kept_checkpoints` and its best
  step's largest data file cut short (evaluate.py refuses it); the best step's folder."""
  shutil.copytree(whole, run)
  for step in {2, 3} - set(kept_checkpoints):
    shutil.rmtree(run / "checkpoints" / str(step))
  (best,) = (run / "best").iterdir()
  data = _largest_data_file(best / "params")
  data.write_bytes(data.read_bytes()[:10])
  return best


@pytest.mark.e2e
@pytest.mark.parametrize("kept", [(2,), ()], ids=["resumed from step 2", "started again"])
def test_an_unreadable_best_step_is_set_aside_and_saved_again(kept, whole_run, tiny_bert, wiki_head, tmp_path, capsys):
  """A best step whose arrays do not read is set aside at start and saved again: from the checkpoint the run resumes
  from when that is its best step (step 2, the first scored, always is), or when the replay scores it best again.
  Either way the run ends as the uninterrupted one, its best step readable."""
  whole, _ = whole_run
  best = _cut_short_its_best_step(whole, tmp_path / "run", kept)
  summary = loop.train(TrainingRun.from_config(checkpoint_kill.kill_config(tiny_bert, tmp_path / "run", wiki_head, "")))
  out = capsys.readouterr().out
  assert f"checkpoint {best} is unreadable (" in out
  assert (f"best step 2 is missing from {best.parent}: saving it again from the train state of that step" in out) == (
    kept == (2,)
  )
  assert summary["best_step"] == int(best.name)
  assert_same_run(whole, tmp_path / "run")
  assert run_dir.load_best(tmp_path / "run")[2]["step"] == summary["best_step"]


@pytest.mark.e2e
def test_a_best_step_gone_before_the_resume_point_stops_the_run_saying_what_to_do(
  whole_run, tiny_bert, wiki_head, tmp_path
):
  """The run resumes from step 3; its best step, 2, cannot be read, and its params are in no checkpoint: one line
  names the step and what to do, instead of a run that ends naming a step best/ does not hold."""
  whole, _ = whole_run
  best = _cut_short_its_best_step(whole, tmp_path / "run", (2, 3))
  assert best.name == "2", "step 3 beat step 2: the run resumes from its best step"
  config = checkpoint_kill.kill_config(tiny_bert, tmp_path / "run", wiki_head, "")
  with pytest.raises(
    DataError,
    match=f"^best step 2 of the run in {re.escape(str(tmp_path / 'run'))} is missing from "
    f"{re.escape(str(best.parent))} \\(unreadable or deleted\\) and its params are "
    f"gone \\(the run is at step 3\\): restore {re.escape(str(best))} from a "
    "copy, or train again in another --config.workdir$",
  ):
    loop.train(TrainingRun.from_config(config))
  (aside,) = best.parent.iterdir()  # Set aside, nothing saved in its place.
  assert aside.name.startswith("corrupt-2-")


@pytest.fixture
def small_disk(tmp_path):
  """A 1 MiB file system of its own (remount it to resize) (a tmpfs; mounting one needs root, else the test is
  skipped)."""
  disk = tmp_path / "disk"
  disk.mkdir()
  if subprocess.run(
    ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True, check=False
  ).returncode:
    pytest.skip("mounting a tmpfs needs root")
  yield disk
  subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_is_one_storage_error_and_the_next_start_cleans_up_and_saves(small_disk, capfd, caplog):
  params = {"kernel": jax.random.normal(jax.random.key(0), (400, 400))}  # 640 kB: one fits, two do not.
  ckpt = checkpoints.RunCheckpoints(small_disk / "run", keep=2, say=print)
  ckpt.save_best(1, params, {"step": 1})
  ckpt.wait()
  best = small_disk / "run" / "best"
  with pytest.raises(StorageError) as raised:  # Raised by the save, or by the wait on its background writes.
    ckpt.save_best(2, params, {"step": 2})
    ckpt.wait()
  assert str(raised.value) == f"cannot write checkpoint {best / '2'}: No space left on device (errno 28)"
  ckpt.wait()  # Reported once: not raised again at the loop's last wait and close.
  ckpt.close()
  assert [p.name for p in best.glob("*.orbax-checkpoint-tmp*")] == ["2.orbax-checkpoint-tmp"]
  err = capfd.readouterr().err
  assert "Traceback" not in err and "Event loop is closed" not in err, err
  assert not [r for r in caplog.records if r.levelname == "ERROR"]

  subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)  # Space is back.
  ckpt = checkpoints.RunCheckpoints(small_disk / "run", keep=2, say=print)
  assert capfd.readouterr().out == f"removed the unfinished saves a stopped run left: {best}/2.orbax-checkpoint-tmp\n"
  ckpt.save_best(2, params, {"step": 2})
  ckpt.close()
  assert os.listdir(best) == ["2"]
  np.testing.assert_array_equal(restore(best, 2, ("params",))[1]["params"]["kernel"], params["kernel"])


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_one_line_and_the_rerun_continues(
  small_disk, tiny_bert, wiki_head, tmp_path, capfd
):
  """The loop on a 1 MiB disk grown to 6 MiB: step 1's train state fits (4 MB), step 2's best params do not."""
  subprocess.run(["mount", "-o", "remount,size=6m", str(small_disk)], check=True)
  config = checkpoint_kill.kill_config(tiny_bert, small_disk / "run", wiki_head, "")
  config.data.cache_dir = str(tmp_path / "cache")
  with pytest.raises(
    StorageError,
    match=r"^cannot write checkpoint .*/run/(best|checkpoints)/2: No space left on "
    r"device \(errno 28\)$",
  ):
    loop.train(TrainingRun.from_config(config))
  assert "Traceback" not in capfd.readouterr().err
  subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
  assert loop.train(TrainingRun.from_config(config))["steps_run"] == 2
  out = capfd.readouterr().out
  assert "removed the unfinished saves a stopped run left" in out and "resumed from" in out
  assert not list((small_disk / "run").glob("*/*.orbax-checkpoint-tmp*"))
