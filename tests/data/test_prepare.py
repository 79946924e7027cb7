"""prepare.py's fetching against a local HTTP server (with Range, and cut connections) and a local folder."""

import dataclasses
import hashlib
import http.server
import io
import json
import pathlib
import re
import tarfile
import threading

import numpy as np
import pytest
import safetensors.numpy

from configs import eval_prompt, promptbert, promptbert_sup
from jaxemb import storage
from jaxemb.data import prepare, sts
from jaxemb.errors import DataError
from jaxemb.models import hf
from jaxemb import spec
from tests.support import shared_path

WIKI = b"".join(b"sentence number %d of the corpus .\n" % i for i in range(300))
NLI = b"sent0,sent1,hard_neg\n" + b"a man sleeps .,a person rests .,a man runs .\n" * 50
SENTEVAL = {  # A few files of each folder a test config reads, in SentEval's data/downstream layout.
  "STS/STS12-en-test/STS.input.MSRpar.txt": b"a cat .\ta dog .\n",
  "STS/STS12-en-test/STS.gs.MSRpar.txt": b"2.5\n",
  "STS/STSBenchmark/sts-dev.csv": b"main-captions\tMSRvid\t2012test\t0001\t5.000\ta plane .\tan airplane .\n",
  "SICK/SICK_test_annotated.txt": b"pair_ID\tA\tB\tscore\tlabel\n1\ta\tb\t4.5\tENTAILMENT\n",
}
STS_TASKS = "STS12,SICKRelatedness"


def _tar(files, prefix=""):
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode="w") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(prefix + name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return out.getvalue()


class _Handler(http.server.BaseHTTPRequestHandler):
  """Serves `files` with HTTP Range; the first `cuts[name]` bytes of a response end the connection there."""

  files: dict[str, bytes] = {}
  cuts: dict[str, int] = {}
  requests: list[tuple[str, str | None]] = []

  def do_GET(self):  # pylint: disable=invalid-name
    name = self.path.lstrip("/")
    self.requests.append((name, self.headers.get("Range")))
    if name not in self.files:
      self.send_error(404)
      return
    data = self.files[name]
    start, end = 0, len(data) - 1
    status = 200
    if self.headers.get("Range"):
      match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers["Range"])
      start, end = int(match.group(1)), int(match.group(2) or end)
      if start >= len(data):
        self.send_response(416)
        self.send_header("Content-Range", f"bytes */{len(data)}")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return
      status = 206
    body = data[start : end + 1]
    self.send_response(status)
    if status == 206:
      self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    cut = self.cuts.pop(name, None)
    self.wfile.write(body if cut is None else body[:cut])  # A cut response promised the whole body.
    self.close_connection = cut is not None

  def log_message(self, *args):
    pass


@pytest.fixture(name="server")
def _server():
  """(a manifest of SENTEVAL, WIKI and NLI with their sizes and digests on a local server, the handler)."""
  files = {"senteval.tar": _tar(SENTEVAL), "wiki1m_for_simcse.txt": WIKI, "nli_for_simcse.csv": NLI}
  handler = type("Handler", (_Handler,), {"files": files, "cuts": {}, "requests": []})
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)  # Quick shutdown.
  thread.start()
  url = f"http://127.0.0.1:{httpd.server_address[1]}/"
  manifest = {
    key: prepare.Artifact(
      a.filename, url + a.filename, len(files[a.filename]), hashlib.sha256(files[a.filename]).hexdigest()
    )
    for key, a in prepare.MANIFEST.items()
  }
  yield manifest, handler
  httpd.shutdown()
  httpd.server_close()


@pytest.fixture(name="model")
def _model(tmp_path):
  """A model directory as prepare checks it: a readable config.json and a whole weights file."""
  out = tmp_path / "model"
  out.mkdir()
  (out / "config.json").write_text(
    json.dumps(
      dict(
        model_type="bert",
        vocab_size=8,
        hidden_size=4,
        num_hidden_layers=1,
        num_attention_heads=1,
        intermediate_size=4,
        max_position_embeddings=8,
      )
    )
  )
  safetensors.numpy.save_file(
    {"a": np.ones((3, 4), np.float32), "b": np.zeros(5, np.float32)},
    out / "model.safetensors",
    metadata={"format": "np"},
  )
  return str(out)


def _train_config(module, tmp_path, model, train_file):
  config = module.get_config()
  config.model.path = model
  config.data.train_file = str(tmp_path / "data" / train_file)
  config.data.senteval_dir = str(tmp_path / "data" / "senteval")
  return config


def _spec(config):
  """The run spec prepare.py builds from `config`."""
  return spec.spec_class(config).from_config(config)


def _assert_senteval(root):
  for name, data in SENTEVAL.items():
    assert (root / name).read_bytes() == data


def test_download_checks_records_and_a_second_run_fetches_nothing(tmp_path, server, model):
  manifest, handler = server
  config = _train_config(promptbert, tmp_path, model, "wiki1m_for_simcse.txt")
  data = tmp_path / "data"
  done = prepare.prepare(_spec(config), manifest=manifest)
  assert sorted(name for name, _ in handler.requests) == ["senteval.tar", "wiki1m_for_simcse.txt"]  # No NLI.
  assert done[str(data / "wiki1m_for_simcse.txt")].startswith("fetched from http://127.0.0.1")
  assert (data / "wiki1m_for_simcse.txt").read_bytes() == WIKI
  _assert_senteval(data / "senteval")
  assert sorted(p.name for p in data.iterdir()) == [
    "senteval",
    "senteval.lock.json",
    "wiki1m_for_simcse.txt",
    "wiki1m_for_simcse.txt.lock.json",
  ]  # The archive is gone.
  lock = json.loads((data / "wiki1m_for_simcse.txt.lock.json").read_text())
  assert lock["sha256"] == hashlib.sha256(WIKI).hexdigest() and lock["size"] == len(WIKI)
  senteval_lock = json.loads((data / "senteval.lock.json").read_text())
  assert senteval_lock["archive"]["sha256"] == manifest["senteval"].sha256
  assert set(senteval_lock["files"]) == set(SENTEVAL)

  mtimes = {p: p.stat().st_mtime_ns for p in data.rglob("*")}
  done = prepare.prepare(_spec(config), manifest=manifest)
  assert len(handler.requests) == 2
  assert done[str(data / "wiki1m_for_simcse.txt")] == "verified"
  assert done[str(data / "senteval")] == f"verified ({len(SENTEVAL)} files)"
  assert {p: p.stat().st_mtime_ns for p in data.rglob("*")} == mtimes


@pytest.mark.parametrize("retries", [2, 0], ids=["resumed_in_the_run", "resumed_by_the_next_run"])
def test_interrupted_download_resumes_with_range(tmp_path, server, model, retries):
  manifest, handler = server
  handler.cuts["wiki1m_for_simcse.txt"] = 1000
  config = _train_config(promptbert, tmp_path, model, "wiki1m_for_simcse.txt")
  wiki = tmp_path / "data" / "wiki1m_for_simcse.txt"
  if not retries:
    with pytest.raises(prepare.PrepareError, match=r"keeps the 1000 bytes received, and running again resumes"):
      prepare.prepare(_spec(config), manifest=manifest, retries=0)
    assert not wiki.exists() and wiki.with_name(wiki.name + ".part").stat().st_size == 1000
  prepare.prepare(_spec(config), manifest=manifest, retries=retries)
  assert [r for r in handler.requests if r[0] == wiki.name] == [(wiki.name, None), (wiki.name, "bytes=1000-")]
  assert wiki.read_bytes() == WIKI
  assert not wiki.with_name(wiki.name + ".part").exists()


@pytest.mark.parametrize("have", [500, len(WIKI)], ids=["half", "all"])
def test_part_file_left_by_a_killed_run_is_continued(tmp_path, server, model, have):
  manifest, handler = server
  config = _train_config(promptbert, tmp_path, model, "wiki1m_for_simcse.txt")
  (tmp_path / "data").mkdir()
  (tmp_path / "data" / "wiki1m_for_simcse.txt.part").write_bytes(WIKI[:have])
  prepare.prepare(_spec(config), manifest=manifest)
  assert ("wiki1m_for_simcse.txt", f"bytes={have}-") in handler.requests  # 416 when nothing is left: kept whole.
  assert (tmp_path / "data" / "wiki1m_for_simcse.txt").read_bytes() == WIKI


@pytest.mark.parametrize("field", ["size", "sha256"])
def test_corrupted_download_is_rejected(tmp_path, server, model, field):
  manifest, _ = server
  wrong = {"size": len(NLI) + 1, "sha256": "0" * 64}[field]
  manifest["nli"] = dataclasses.replace(manifest["nli"], **{field: wrong})
  config = _train_config(promptbert_sup, tmp_path, model, "nli_for_simcse.csv")
  nli = tmp_path / "data" / "nli_for_simcse.csv"
  actual = {"size": len(NLI), "sha256": hashlib.sha256(NLI).hexdigest()}[field]
  with pytest.raises(
    prepare.PrepareError,
    match=rf"{re.escape(str(nli))}: {field} mismatch \(from http.*\): "
    rf"expected {wrong}, got {actual}; moved to .*\.corrupt",
  ):
    prepare.prepare(_spec(config), manifest=manifest)
  assert not nli.exists() and not nli.with_name(nli.name + ".lock.json").exists()
  assert nli.with_name(nli.name + ".corrupt").read_bytes() == NLI


def test_file_changed_after_fetching_is_rejected_then_fetched_again(tmp_path, server, model):
  manifest, handler = server
  config = _train_config(promptbert, tmp_path, model, "wiki1m_for_simcse.txt")
  prepare.prepare(_spec(config), manifest=manifest)
  wiki, dev = tmp_path / "data" / "wiki1m_for_simcse.txt", tmp_path / "data" / "senteval/STS/STSBenchmark/sts-dev.csv"
  wiki.write_bytes(WIKI.replace(b"number", b"NUMBER"))
  with pytest.raises(
    prepare.PrepareError,
    match=rf"{re.escape(str(wiki))}: sha256 mismatch \(since it was fetched\): "
    rf"expected {hashlib.sha256(WIKI).hexdigest()}, got [0-9a-f]{{64}}",
  ):
    prepare.prepare(_spec(config), manifest=manifest)
  dev.write_bytes(b"x")
  with pytest.raises(prepare.PrepareError, match=rf"{re.escape(str(dev))}: size mismatch .*expected \d+, got 1"):
    prepare.prepare(_spec(config), manifest=manifest)
  prepare.prepare(_spec(config), manifest=manifest)  # Both were moved aside: fetched anew.
  assert wiki.read_bytes() == WIKI
  _assert_senteval(tmp_path / "data" / "senteval")
  assert [name for name, _ in handler.requests].count("wiki1m_for_simcse.txt") == 2


@pytest.mark.parametrize("senteval", ["folder", "tar"])
def test_offline_copy_from_a_local_folder(tmp_path, server, model, senteval):
  """A folder laid out as ../shared/data: senteval/ unpacked (or SimCSE's tar, here wrapped in a folder), files in
  subfolders; a sample under its own name is found by the configured file name."""
  manifest, handler = server
  source = tmp_path / "source"
  for name, data in {"wiki/wiki1m_sample.txt": WIKI[:700], "nli/nli_for_simcse.csv": NLI}.items():
    (source / name).parent.mkdir(parents=True, exist_ok=True)
    (source / name).write_bytes(data)
  if senteval == "folder":
    for name, data in SENTEVAL.items():
      (source / "senteval" / name).parent.mkdir(parents=True, exist_ok=True)
      (source / "senteval" / name).write_bytes(data)
  else:  # Unlike the public one, this archive has no known size or digest.
    (source / "senteval.tar").write_bytes(_tar(SENTEVAL, prefix="downstream/"))
    manifest["senteval"] = dataclasses.replace(manifest["senteval"], size=None, sha256=None)
  data = tmp_path / "data"
  prepare.prepare(
    _spec(_train_config(promptbert, tmp_path, model, "wiki1m_sample.txt")), source=source, manifest=manifest
  )
  prepare.prepare(
    _spec(_train_config(promptbert_sup, tmp_path, model, "nli_for_simcse.csv")), source=source, manifest=manifest
  )
  assert not handler.requests
  assert (data / "wiki1m_sample.txt").read_bytes() == WIKI[:700]
  assert (data / "nli_for_simcse.csv").read_bytes() == NLI
  _assert_senteval(data / "senteval")
  assert json.loads((data / "nli_for_simcse.csv.lock.json").read_text())["source"] == str(
    source / "nli" / "nli_for_simcse.csv"
  )
  with pytest.raises(prepare.PrepareError, match=r"no wiki1m_for_simcse.txt under .*source or its subfolders"):
    prepare.prepare(_spec(_train_config(promptbert, tmp_path, model, "wiki1m_for_simcse.txt")), source=source)


def test_evaluation_config_fetches_senteval_only(tmp_path, server, model):
  manifest, handler = server
  config = eval_prompt.get_config()
  config.model.path = model
  config.eval.tasks = STS_TASKS
  config.data.senteval_dir = str(tmp_path / "senteval")
  done = prepare.prepare(_spec(config), manifest=manifest)
  assert [name for name, _ in handler.requests] == ["senteval.tar"]
  assert list(done) == [str(tmp_path / "senteval"), model]
  _assert_senteval(tmp_path / "senteval")


def test_data_already_in_place_is_kept_unverified(tmp_path, server, model):
  manifest, handler = server
  config = eval_prompt.get_config()
  config.model.path = model
  config.eval.tasks = STS_TASKS
  config.data.senteval_dir = str(tmp_path / "senteval")
  for folder in ("STS/STS12-en-test", "STS/STSBenchmark", "SICK"):
    (tmp_path / "senteval" / folder).mkdir(parents=True)
  done = prepare.prepare(_spec(config), manifest=manifest)
  assert done[str(tmp_path / "senteval")].startswith("present (not fetched by prepare.py")
  assert not handler.requests


def test_into_a_bucket_staged_uploaded_and_verified_again_from_the_listing(
  tmp_path, server, model, bucket, monkeypatch
):
  """The corpus, SentEval and the model in a bucket: fetched and checked in the local staging folder, uploaded with
  their lock records (no archive, part or staged file left anywhere), read from there as train.py and evaluate.py
  read them; a second run fetches and uploads nothing and reads no data object (the listing's sizes and MD5s); an
  object changed since is named and moved aside, a missing one noticed, and the next run fetches both again."""
  gcsfs = pytest.importorskip("gcsfs")
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  monkeypatch.chdir(tmp_path)
  manifest, handler = server
  data, wiki = f"{bucket}/data", f"{bucket}/data/wiki1m_for_simcse.txt"
  storage.upload(pathlib.Path(model), f"{bucket}/models/m")
  config = _train_config(promptbert, tmp_path, f"{bucket}/models/m", "wiki1m_for_simcse.txt")
  config.data.train_file, config.data.senteval_dir = wiki, f"{data}/senteval"
  done = prepare.prepare(_spec(config), manifest=manifest)
  assert done[wiki].startswith("fetched from http://127.0.0.1")
  assert done[f"{bucket}/models/m"] == f"model in {bucket}/models/m"
  listed = storage.objects(data)
  assert sorted(listed) == sorted(
    [
      "senteval.lock.json",
      "wiki1m_for_simcse.txt",
      "wiki1m_for_simcse.txt.lock.json",
      *(f"senteval/{name}" for name in SENTEVAL),
    ]
  )
  assert not [p for p in (tmp_path / "downloads").rglob("*") if p.is_file()], "the staging folder is emptied"
  assert storage.path(wiki).read_bytes() == WIKI
  assert sts.load_sts_task(f"{data}/senteval", "STSBenchmark", "dev").subsets["dev"].sentences2 == ["an airplane ."]

  opened = []

  def _open(fs, path, *args, open_object=gcsfs.GCSFileSystem._open, **kwargs):  # pylint: disable=protected-access
    opened.append(path)
    return open_object(fs, path, *args, **kwargs)

  monkeypatch.setattr(gcsfs.GCSFileSystem, "_open", _open)
  done = prepare.prepare(_spec(config), manifest=manifest)
  assert (done[wiki], done[f"{data}/senteval"]) == ("verified", f"verified ({len(SENTEVAL)} files)")
  assert len(handler.requests) == 2 and storage.objects(data) == listed
  assert opened and all(name.endswith((".lock.json", "/config.json")) for name in opened), opened

  storage.path(wiki).write_bytes(WIKI.replace(b"number", b"NUMBER"))  # The same size.
  storage.path(f"{data}/senteval/SICK/SICK_test_annotated.txt").unlink()
  with pytest.raises(
    prepare.PrepareError,
    match=rf"^{wiki}: md5 mismatch \(since it was fetched\): expected "
    rf"{hashlib.md5(WIKI).hexdigest()}, got [0-9a-f]{{32}}; moved to {wiki}\.corrupt \(running",
  ):
    prepare.prepare(_spec(config), manifest=manifest)
  prepare.prepare(_spec(config), manifest=manifest)
  assert [name for name, _ in handler.requests] == ["wiki1m_for_simcse.txt", "senteval.tar"] * 2
  assert storage.path(wiki).read_bytes() == WIKI and storage.path(f"{wiki}.corrupt").is_file()
  assert (
    storage.path(f"{data}/senteval/SICK/SICK_test_annotated.txt").read_bytes()
    == SENTEVAL["SICK/SICK_test_annotated.txt"]
  )
  assert not list(tmp_path.glob("gs:*"))


def test_an_evaluation_config_copies_senteval_into_a_bucket_and_checks_the_model_there(
  tmp_path, model, bucket, monkeypatch
):
  """prepare.py --source with SentEval and the model in a bucket: the unpacked folder copied there; the model
  checked in its bucket, where a missing config.json or weights file is one line naming it."""
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  monkeypatch.chdir(tmp_path)
  source = tmp_path / "source"
  for name, data in SENTEVAL.items():
    (source / "senteval" / name).parent.mkdir(parents=True, exist_ok=True)
    (source / "senteval" / name).write_bytes(data)
  config = eval_prompt.get_config()
  config.model.path, config.eval.tasks, config.data.senteval_dir = f"{bucket}/m", STS_TASKS, f"{bucket}/senteval"
  with pytest.raises(hf.CheckpointError, match=rf"^{bucket}/m holds no config.json: not a Hugging Face model folder"):
    prepare.prepare(_spec(config), source=source)
  storage.upload(pathlib.Path(model) / "config.json", f"{bucket}/m/config.json")
  with pytest.raises(hf.CheckpointError, match=rf"^{bucket}/m: no weights found \(looked for model.safetensors"):
    prepare.prepare(_spec(config), source=source)
  storage.upload(pathlib.Path(model), f"{bucket}/m")
  assert prepare.prepare(_spec(config), source=source) == {
    f"{bucket}/senteval": f"verified ({len(SENTEVAL)} files)",
    f"{bucket}/m": f"model in {bucket}/m",
  }
  _assert_senteval(storage.path(f"{bucket}/senteval"))
  assert json.loads(storage.path(f"{bucket}/senteval.lock.json").read_text())["source"] == str(source / "senteval")
  assert not list(tmp_path.glob("gs:*"))


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_senteval_copy_a_fault_stopped_is_fetched_again_by_the_next_run(tmp_path, model, where, request, monkeypatch):
  """The copy stopped at its last file (a full disk: half of it written; in a bucket, the upload cut), when every
  folder a config reads is there: the next run fetches it again, where it took the folders for data put there by
  hand, and the folder ends whole and locked."""
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  files = {**SENTEVAL, "STS/STSBenchmark/sts-test.csv": SENTEVAL["STS/STSBenchmark/sts-dev.csv"]}  # Copied last.
  source = tmp_path / "source"
  for name, data in files.items():
    (source / "senteval" / name).parent.mkdir(parents=True, exist_ok=True)
    (source / "senteval" / name).write_bytes(data)
  root = str(tmp_path) if where == "local" else request.getfixturevalue("bucket")
  config = eval_prompt.get_config()
  config.model.path, config.eval.tasks, config.data.senteval_dir = model, STS_TASKS, f"{root}/senteval"
  if where == "local":
    copy = prepare.shutil.copyfile

    def fault(src, dst):
      if pathlib.Path(dst).name == "sts-test.csv":
        pathlib.Path(dst).write_bytes(pathlib.Path(src).read_bytes()[:5])
        raise OSError(28, "No space left on device")
      return copy(src, dst)

    monkeypatch.setattr(prepare.shutil, "copyfile", fault)
  else:
    upload = storage.upload

    def fault(local, target):
      if local.is_dir():
        for file in sorted(p for p in local.rglob("*") if p.is_file())[:-1]:
          upload(file, f"{target}/{file.relative_to(local).as_posix()}")
        raise ConnectionResetError("the connection was cut")
      return upload(local, target)

    monkeypatch.setattr(storage, "upload", fault)
  with pytest.raises(OSError):
    prepare.prepare(_spec(config), source=source)
  monkeypatch.undo()
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  done = prepare.prepare(_spec(config), source=source)
  assert done[f"{root}/senteval"] == f"fetched from {source / 'senteval'} ({len(files)} files)"
  for name, data in files.items():
    assert storage.path(f"{root}/senteval/{name}").read_bytes() == data
  assert not storage.path(f"{root}/senteval.unfinished").exists()
  assert prepare.prepare(_spec(config), source=source)[f"{root}/senteval"] == f"verified ({len(files)} files)"


def test_a_garbled_lock_record_is_moved_aside_and_its_data_fetched_again(tmp_path, model, caplog):
  """A lock file that does not read (garbled on disk since it was written whole) stopped every later run with a
  traceback: moved to `.corrupt`, said, and the file or folder fetched again and locked anew."""
  source = tmp_path / "source"
  (source / "wiki").mkdir(parents=True)
  (source / "wiki" / "wiki1m_sample.txt").write_bytes(WIKI[:700])
  for name, data in SENTEVAL.items():
    (source / "senteval" / name).parent.mkdir(parents=True, exist_ok=True)
    (source / "senteval" / name).write_bytes(data)
  config = _spec(_train_config(promptbert, tmp_path, model, "wiki1m_sample.txt"))
  data = tmp_path / "data"
  prepare.prepare(config, source=source)
  locks = [data / "wiki1m_sample.txt.lock.json", data / "senteval.lock.json"]
  for lock, garbled in zip(locks, ['{"size": 70', '{"source": "x"}\n']):  # Cut JSON; a folder's without "files".
    lock.write_text(garbled)
  done = prepare.prepare(config, source=source)
  assert done[str(data / "wiki1m_sample.txt")].startswith("fetched from") and done[str(data / "senteval")].startswith(
    "fetched from"
  )
  for lock, garbled in zip(locks, ['{"size": 70', '{"source": "x"}\n']):
    assert lock.with_name(lock.name + ".corrupt").read_text() == garbled and "sha256" in lock.read_text()
    assert f"{lock} is unreadable (" in caplog.text
  done = prepare.prepare(config, source=source)
  assert done[str(data / "wiki1m_sample.txt")] == "verified" and done[str(data / "senteval")].startswith("verified")


def test_configs_default_paths_follow_jaxemb_data(monkeypatch):
  monkeypatch.setenv("JAXEMB_DATA", "/big/disk")
  assert promptbert.get_config().data.train_file == "/big/disk/wiki1m_for_simcse.txt"
  assert promptbert.get_config().data.senteval_dir == "/big/disk/senteval"
  assert eval_prompt.get_config().data.senteval_dir == "/big/disk/senteval"
  monkeypatch.delenv("JAXEMB_DATA")
  assert eval_prompt.get_config().data.senteval_dir == "data/senteval"


def _damaged(data: bytes, damage: str) -> bytes:
  header_end = 8 + int.from_bytes(data[:8], "little")
  return {
    "last byte cut": data[:-1],
    "cut in the header": data[:20],
    "empty": b"",
    "header length garbage": b"\xff" * 8 + data[8:],
    "header not JSON": data[:8] + b"{" + b"\x00" * (header_end - 9) + data[header_end:],
    "header not a dict of tensors": data[:8] + b'{"a": 1}'.ljust(header_end - 8) + data[header_end:],
  }[damage]


@pytest.mark.parametrize(
  "damage, detail",
  [
    ("last byte cut", r"\d+ bytes, but its header places tensor bytes up to byte \d+"),
    ("cut in the header", r"its header length field says \d+ bytes; the file has 20"),
    ("empty", r"0 bytes, too short for its header"),
    ("header length garbage", r"its header length field says 18446744073709551615 bytes"),
    ("header not JSON", r"its header is not a safetensors JSON header"),
    ("header not a dict of tensors", r"its header is not a safetensors JSON header"),
  ],
)
def test_truncated_or_corrupt_safetensors_is_refused(model, damage, detail):
  """Case 6: prepare.py said "model in ..." (exit 0) for a truncated model.safetensors, which training then failed
  to load."""
  path = pathlib.Path(model) / "model.safetensors"
  assert prepare.prepare_model(model) == path.parent  # The whole file passes.
  path.write_bytes(_damaged(path.read_bytes(), damage))
  with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: truncated or corrupt weights file \({detail}"):
    prepare.prepare_model(model)


def test_sharded_safetensors_need_every_shard_whole(model):
  model_dir = pathlib.Path(model)
  whole = (model_dir / "model.safetensors").read_bytes()
  (model_dir / "model.safetensors").unlink()
  (model_dir / "model-00001-of-00002.safetensors").write_bytes(whole)
  (model_dir / "model.safetensors.index.json").write_text(
    json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
  )
  with pytest.raises(DataError, match=r"model-00002-of-00002.safetensors: missing, though .*index.json lists it"):
    prepare.prepare_model(model)
  (model_dir / "model-00002-of-00002.safetensors").write_bytes(whole[:-4])
  with pytest.raises(DataError, match=r"model-00002-of-00002.safetensors: truncated or corrupt weights file"):
    prepare.prepare_model(model)
  (model_dir / "model-00002-of-00002.safetensors").write_bytes(whole)
  assert prepare.prepare_model(model) == model_dir


@pytest.mark.parametrize("zipped", [True, False])
def test_truncated_pytorch_bin_is_refused(model, zipped):
  """torch.save's zip (since torch 1.6) and its legacy pickle both pass whole; a cut zip has no directory left."""
  import torch  # pylint: disable=g-import-not-at-top

  model_dir = pathlib.Path(model)
  (model_dir / "model.safetensors").unlink()
  path = model_dir / "pytorch_model.bin"
  torch.save({"a": torch.ones(3, 4)}, path, _use_new_zipfile_serialization=zipped)
  assert prepare.prepare_model(model) == model_dir
  path.write_bytes(path.read_bytes()[:-100] if zipped else b"PK\x03\x04 not a pickle")
  with pytest.raises(
    DataError,
    match=rf"^{re.escape(str(path))}: truncated or corrupt weights file \(neither a "
    r"whole zip \(torch.save\) nor a pickle\)",
  ):
    prepare.prepare_model(model)


def test_architecture_of_a_run_from_scratch_is_written_once_and_initialised_as_hf(tmp_path, caplog):
  """configs/pretrain_mlm.py: prepare.py writes config.json and the tokenizer, no weights; load_pretrained then
  initialises the params from scratch (with the MLM head and, untied, its own decoder); another architecture in
  the same directory is refused."""
  import logging  # pylint: disable=g-import-not-at-top
  from configs import pretrain_mlm  # pylint: disable=g-import-not-at-top
  from jaxemb.models import hf  # pylint: disable=g-import-not-at-top

  config = pretrain_mlm.get_config("untied")
  config.model.path = str(tmp_path / "arch")
  config.model.architecture.tokenizer = str(shared_path("tokenizers", "bert-base-uncased"))
  config.model.architecture.hidden_size = 16
  assert "written" in prepare.prepare_architecture(
    config.model.path, spec.Architecture.from_config(config.model.architecture), config.model.tie_word_embeddings
  )
  assert not hf.has_weights(tmp_path / "arch") and (tmp_path / "arch" / "tokenizer_config.json").is_file()
  assert "already written" in prepare.prepare_architecture(
    config.model.path, spec.Architecture.from_config(config.model.architecture), config.model.tie_word_embeddings
  )
  with caplog.at_level(logging.INFO):
    model_config, params = hf.load_pretrained(tmp_path / "arch")
  assert "initialised from scratch" in caplog.text
  assert not model_config.tie_word_embeddings and model_config.vocab_size == 30522
  assert params["mlm_head"]["decoder"].shape == (16, 30522) and "pooler" in params
  with pytest.raises(prepare.PrepareError, match="holds another architecture"):  # The same, tied.
    prepare.prepare_architecture(config.model.path, spec.Architecture.from_config(config.model.architecture))
  config.model.architecture.num_hidden_layers = 3
  with pytest.raises(prepare.PrepareError, match="holds another architecture"):
    prepare.prepare_architecture(
      config.model.path, spec.Architecture.from_config(config.model.architecture), config.model.tie_word_embeddings
    )


def test_architecture_of_a_run_from_scratch_is_written_into_a_bucket(bucket, tmp_path, monkeypatch):
  from configs import pretrain_mlm  # pylint: disable=g-import-not-at-top

  monkeypatch.chdir(tmp_path)
  architecture = pretrain_mlm.get_config().model.architecture
  architecture.tokenizer, architecture.hidden_size = str(shared_path("tokenizers", "bert-base-uncased")), 16
  assert "written to" in prepare.prepare_architecture(f"{bucket}/arch", spec.Architecture.from_config(architecture))
  assert "already written" in prepare.prepare_architecture(
    f"{bucket}/arch", spec.Architecture.from_config(architecture)
  )
  assert hf.read_config(storage.path(f"{bucket}/arch")).hidden_size == 16 and not list(tmp_path.glob("gs:*"))
