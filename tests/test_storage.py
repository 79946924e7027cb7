"""jaxemb.storage against a real Cloud Storage emulator (fake-gcs-server on loopback): paths, whole-object writes,
the download cache, create-if-absent, and the one-line errors a user meets before any work starts."""

import dataclasses
import errno
import hashlib
import http.server
import json
import os
import re
import stat
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from jaxemb import atomic, storage
from jaxemb.errors import ConfigError, StorageError, WorkdirError
from tests.support import shared_path


def test_local_paths_expand_the_home_and_other_schemes_are_one_line(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert storage.path("~/runs/x") == storage.Path(tmp_path / "runs" / "x")
  assert not storage.is_remote("runs/x") and storage.is_remote("gs://b/x")
  with pytest.raises(
    ConfigError,
    match=r"^hdfs://nn/runs: hdfs:// paths are not supported; use a local path or "
    r"gs://bucket/\.\.\.$",
  ):
    storage.path("hdfs://nn/runs")


def test_a_replaced_file_has_the_permissions_a_plain_write_gives_it(tmp_path, monkeypatch):
  """A new file's are those the umask leaves, not tempfile's owner-only 0600 (an export or embeddings others read on
  a shared disk); a file written again keeps its own."""
  monkeypatch.setattr(storage, "_UMASK", 0o027)
  new, old = tmp_path / "new" / "manifest.json", tmp_path / "old.json"
  storage.replace_file(new, lambda f: f.write(b"{}"))
  assert stat.S_IMODE(new.stat().st_mode) == 0o640
  old.write_bytes(b"")
  old.chmod(0o604)
  storage.replace_file(old, lambda f: f.write(b"{}"))
  assert stat.S_IMODE(old.stat().st_mode) == 0o604 and old.read_bytes() == b"{}"


def test_a_replaced_file_reaches_the_disk_before_its_rename(tmp_path, monkeypatch):
  """A power loss after the rename leaves the new bytes, not an empty file under the new name: fsync comes first."""
  calls = []
  fsync, replace = os.fsync, os.replace
  monkeypatch.setattr(os, "fsync", lambda fd: calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or fsync(fd))
  monkeypatch.setattr(os, "replace", lambda a, b: calls.append(("replace", a)) or replace(a, b))
  storage.replace_file(tmp_path / "summary.json", lambda f: f.write(b"{}"))
  (temporary,) = {name for _, name in calls}
  assert calls == [("fsync", temporary), ("replace", temporary)] and temporary.endswith(storage.PARTIAL)


def test_the_partial_files_a_killed_writer_left_are_removed_by_the_folders_owner(tmp_path):
  kept = [tmp_path / "summary.json", tmp_path / "sub" / "x.json.abc.partial", tmp_path / "partial.txt"]
  left = [tmp_path / "metrics.jsonl.k2j3h4.partial", tmp_path / "summary.json.zz.partial"]
  for path in kept + left:
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"{")
  assert storage.remove_partial_files(tmp_path) == sorted(left)
  assert all(p.exists() for p in kept) and not any(p.exists() for p in left)
  assert storage.remove_partial_files(tmp_path / "missing") == []
  for path in left:
    path.write_bytes(b"{")
  assert storage.remove_partial_files(tmp_path, "summary.json") == [left[1]]  # One file's alone.


def test_a_gs_path_without_gcsfs_says_what_to_install(monkeypatch):
  monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError.
  storage._gcsfs.cache_clear()  # pylint: disable=protected-access
  try:
    with pytest.raises(StorageError, match=r"^reading and writing gs:// paths needs gcsfs: pip install gcsfs$"):
      storage.path("gs://bucket/runs/x")
  finally:
    storage._gcsfs.cache_clear()  # pylint: disable=protected-access


def test_file_digests_read_a_local_file_and_an_object_whole_across_chunks(bucket, tmp_path, monkeypatch):
  """Chunks of 1000 bytes (the library's: 4 MiB): a file of 2,308 bytes spans three, the last one short."""
  monkeypatch.setattr(storage, "_CHUNK_BYTES", 1000)
  data = bytes(range(256)) * 9 + b"tail"
  expected = {"size": 2308, "sha256": hashlib.sha256(data).hexdigest(), "md5": hashlib.md5(data).hexdigest()}
  (tmp_path / "file.bin").write_bytes(data)
  storage.path(f"{bucket}/file.bin").write_bytes(data)
  assert storage.file_digests(tmp_path / "file.bin", "sha256", "md5") == expected
  assert storage.file_digests(f"{bucket}/file.bin", "sha256", "md5") == expected
  assert storage.file_digests(tmp_path / "file.bin", "md5") == {"size": 2308, "md5": expected["md5"]}
  with pytest.raises(FileNotFoundError):
    storage.file_digests(f"{bucket}/missing.bin", "sha256")


def test_atomic_writes_to_a_bucket_are_whole_or_nothing(bucket):
  target = f"{bucket}/run/fingerprint.json"
  atomic.write_json(target, {"a": 1})
  assert json.loads(storage.path(target).read_text()) == {"a": 1}

  def fail(f):
    f.write(b"half of a new")
    raise OSError(28, "No space left on device")

  with pytest.raises(StorageError, match=f"^cannot write {target}: No space left on device$"):
    atomic.write(target, fail)
  assert json.loads(storage.path(target).read_text()) == {"a": 1}
  assert [p.name for p in storage.path(f"{bucket}/run").iterdir()] == ["fingerprint.json"]


def test_create_if_absent_replace_if_unchanged(bucket):
  url = f"{bucket}/run/lease"
  assert storage.read_object(url) is None
  generation = storage.create(url, b"one")
  with pytest.raises(storage.Conflict):
    storage.create(url, b"two")
  data, read_generation, age = storage.read_object(url)
  assert (data, read_generation) == (b"one", generation) and -5 < age < 60
  newer = storage.replace(url, b"three", generation)
  with pytest.raises(storage.Conflict):  # Another writer renewed it since `generation` was read.
    storage.replace(url, b"four", generation)
  assert storage.read_object(url)[:2] == (b"three", newer)


def test_local_copy_fetches_each_object_once_per_host_and_again_when_it_changes(bucket, tmp_path, monkeypatch):
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  folder = storage.path(f"{bucket}/models/tiny")
  (folder / "config.json").write_text('{"a": 1}')
  (folder / "sub" / "vocab.txt").write_text("x\ny\n")
  fetched = []
  fetch = storage._fetch  # pylint: disable=protected-access
  monkeypatch.setattr(storage, "_fetch", lambda fs, url, *args: (fetched.append(url), fetch(fs, url, *args))[1])

  local = storage.local_copy(f"{bucket}/models/tiny/")
  assert local == tmp_path / "downloads" / bucket[5:] / "models" / "tiny"
  assert json.loads((local / "config.json").read_text()) == {"a": 1}
  assert (local / "sub" / "vocab.txt").read_text() == "x\ny\n"
  assert sorted(fetched) == [f"{bucket}/models/tiny/config.json", f"{bucket}/models/tiny/sub/vocab.txt"]

  fetched.clear()
  assert storage.local_copy(f"{bucket}/models/tiny") == local and not fetched
  (folder / "config.json").write_text('{"a": 2}')
  (local / "sub" / "vocab.txt").unlink()
  storage.local_copy(f"{bucket}/models/tiny")
  assert sorted(fetched) == [f"{bucket}/models/tiny/config.json", f"{bucket}/models/tiny/sub/vocab.txt"]
  assert json.loads((local / "config.json").read_text()) == {"a": 2}

  file = storage.local_copy(f"{bucket}/models/tiny/config.json")
  assert json.loads(file.read_text()) == {"a": 2} and file.is_file()
  with pytest.raises(FileNotFoundError, match=f"^{bucket}/models/none: no such file or folder$"):
    storage.local_copy(f"{bucket}/models/none")


def _corpus_in_a_bucket(bucket, tmp_path, monkeypatch) -> tuple[str, bytes, list[str]]:
  """(its URL, its contents, the URLs fetched from now on) of the wiki sample uploaded to `bucket`, the download
  cache in `tmp_path`."""
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  corpus = shared_path("data", "wiki", "wiki1m_sample.txt")
  url = f"{bucket}/data/wiki.txt"
  storage.upload(corpus, url)
  fetched = []
  fetch = storage._fetch  # pylint: disable=protected-access
  monkeypatch.setattr(
    storage, "_fetch", lambda fs, source, *args: (fetched.append(source), fetch(fs, source, *args))[1]
  )
  return url, corpus.read_bytes(), fetched


@pytest.mark.parametrize("digest", ["md5", "crc32c"])
def test_a_cached_copy_that_differs_from_its_listing_is_fetched_again(bucket, tmp_path, monkeypatch, capsys, digest):
  """The issue's case: the cached copy of the corpus truncated in place (1,279,831 -> 627,203 bytes) between a kill
  and its rerun is fetched again, as is one edited in place at its size, found by the listing's MD5 (or CRC32C,
  Cloud Storage's only digest of a composite object); a copy unchanged since it was verified is not read again."""
  url, data, fetched = _corpus_in_a_bucket(bucket, tmp_path, monkeypatch)
  if digest == "crc32c":  # Listed as a composite object is.
    listing = storage.objects
    monkeypatch.setattr(
      storage, "objects", lambda value: {n: dataclasses.replace(o, md5=None) for n, o in listing(value).items()}
    )
  hashed = []
  check = storage._digest_check  # pylint: disable=protected-access
  monkeypatch.setattr(storage, "_digest_check", lambda listed: (hashed.append(listed), check(listed))[1])
  local = storage.local_copy(url)
  assert local.read_bytes() == data and fetched == [url]
  fetched.clear(), hashed.clear()
  assert storage.local_copy(url) == local and not fetched and not hashed  # A stat, no read.

  with open(local, "r+b") as f:
    f.truncate(627_203)
  storage.local_copy(url)
  assert local.read_bytes() == data and fetched == [url]
  assert capsys.readouterr().err == (
    f"{local} in the download cache differs from {url} (627,203 bytes, 1,279,831 listed): fetching it again\n"
  )
  fetched.clear()
  local.write_bytes(data.replace(b"a", b"e", 1))  # The same size, written a second later.
  os.utime(local, ns=(local.stat().st_atime_ns, local.stat().st_mtime_ns + 10**9))
  storage.local_copy(url)
  assert local.read_bytes() == data and fetched == [url]
  edited, listed = (check(storage.objects(url)[""]) for _ in range(2))
  edited[2].update(data.replace(b"a", b"e", 1))
  assert capsys.readouterr().err == (
    f"{local} in the download cache differs from {url} ({digest} {edited[2].digest().hex()}, {listed[1]} "
    "listed): fetching it again\n"
  )

  (manifest,) = (tmp_path / "downloads" / ".manifests").iterdir()
  manifest.write_text(json.dumps({"": storage.objects(url)[""].generation}))  # An older jaxemb's: no mtime.
  fetched.clear(), hashed.clear()
  storage.local_copy(url)
  assert not fetched and len(hashed) == 1  # Read once to check it, then recorded as verified.
  assert json.loads(manifest.read_text()) == {
    "": {"generation": storage.objects(url)[""].generation, "mtime_ns": local.stat().st_mtime_ns}
  }


def test_a_download_that_does_not_match_its_listing_is_not_put_in_place(bucket, tmp_path, monkeypatch):
  """An object replaced while it was fetched (its listing says other bytes than came): nothing reaches the cache."""
  url, data, _ = _corpus_in_a_bucket(bucket, tmp_path, monkeypatch)
  listing = storage.objects
  monkeypatch.setattr(
    storage, "objects", lambda value: {n: dataclasses.replace(o, md5="0" * 32) for n, o in listing(value).items()}
  )
  with pytest.raises(
    StorageError,
    match=re.escape(
      f"the download of {url} (1,279,831 bytes, md5 {hashlib.md5(data).hexdigest()}) does not match its listing "
      f"(1,279,831 bytes, md5 {'0' * 32}): the object changed while it was fetched; run the command again"
    ),
  ):
    storage.local_copy(url)
  assert [p for p in (tmp_path / "downloads").rglob("*") if p.is_file()] == []


class _SmallDisk:
  """A file system with `room` bytes left, for the files `replace_file` writes: a write past it writes what fits
  and raises OSError(ENOSPC), as write(2) does on a full disk. (A real full disk needs root to mount; a file-size
  limit, RLIMIT_FSIZE, gives EFBIG and a SIGXFSZ instead.)"""

  def __init__(self, monkeypatch, room: int):
    self.room = room
    self._open = storage.tempfile.NamedTemporaryFile
    monkeypatch.setattr(storage.tempfile, "NamedTemporaryFile", self.open)

  def open(self, *args, **kwargs):
    f = self._open(*args, **kwargs)
    write = f.write

    def limited(data):
      fits = min(len(data), self.room)
      self.room -= fits
      write(data[:fits])
      if fits < len(data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return fits

    f.write = limited
    return f


def test_a_full_disk_under_the_download_cache_names_the_file_and_how_to_move_the_cache(bucket, tmp_path, monkeypatch):
  """HOME on a small disk (the issue's 20 MB tmpfs): one line naming the file, the cache and JAXEMB_DOWNLOADS, and
  nothing half-written: not the copy, not its manifest. A copy that landed before the manifest failed is checked
  and kept by the next call."""
  url, data, fetched = _corpus_in_a_bucket(bucket, tmp_path, monkeypatch)
  downloads, target = tmp_path / "downloads", tmp_path / "downloads" / bucket[5:] / "data" / "wiki.txt"
  advice = "free space there, or set JAXEMB_DOWNLOADS to a folder on a disk with room"
  with monkeypatch.context() as disk:
    small = _SmallDisk(disk, 100_000)
    with pytest.raises(StorageError) as full:
      storage.local_copy(url)
    assert str(full.value) == (
      f"cannot copy {url} into the download cache {downloads}: No space left on device (errno 28) writing {target}; "
      f"{advice}"
    )
    assert [p for p in downloads.rglob("*") if p.is_file()] == []
    small.room = len(data)  # Room for the copy, not for the manifest.
    with pytest.raises(StorageError, match=re.escape(f"(errno 28) writing {downloads / '.manifests'}/")):
      storage.local_copy(url)
    assert [p for p in downloads.rglob("*") if p.is_file()] == [target] and target.read_bytes() == data
  fetched.clear()
  storage.local_copy(url)
  assert not fetched and len(list((downloads / ".manifests").iterdir())) == 1


def test_upload_staging_and_the_listing_of_sizes_and_digests(bucket, tmp_path, monkeypatch):
  """A local folder's files uploaded under a prefix; the listing gives each object's size, generation and MD5
  (Cloud Storage's, equal to hashlib's of what was uploaded) without reading it; the staging place of a gs:// path
  is in the download cache."""
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  local = storage.staging(f"{bucket}/data/senteval")
  assert local == tmp_path / "downloads" / ".staging" / bucket[5:] / "data" / "senteval"
  (local / "STS").mkdir(parents=True)
  (local / "STS" / "a.txt").write_bytes(b"one")
  (local / "b.txt").write_bytes(b"two!")
  storage.upload(local, f"{bucket}/data/senteval")
  storage.upload(local / "b.txt", f"{bucket}/data/b.txt")
  listed = storage.objects(f"{bucket}/data/senteval/")
  assert sorted(listed) == ["STS/a.txt", "b.txt"]
  assert [(o.size, o.md5) for o in listed.values()] == [
    (3, hashlib.md5(b"one").hexdigest()),
    (4, hashlib.md5(b"two!").hexdigest()),
  ]
  (file,) = storage.objects(f"{bucket}/data/b.txt").values()
  assert file.md5 == listed["b.txt"].md5 and file.generation != listed["b.txt"].generation
  storage.path(f"{bucket}/data/senteval/b.txt").write_bytes(b"new!")  # Listed above: the listing is read again.
  assert storage.objects(f"{bucket}/data/senteval/b.txt")[""].md5 == hashlib.md5(b"new!").hexdigest()
  assert list(storage.objects(f"{bucket}/data/b.txt")) == [""]
  with pytest.raises(FileNotFoundError, match=f"^{bucket}/data/none: no such file or folder$"):
    storage.objects(f"{bucket}/data/none")


def test_check_reads_writes_and_names_a_missing_bucket(bucket):
  storage.check([f"{bucket}/data/wiki.txt"], writes=[f"{bucket}/runs/r1"])
  assert not list(storage.path(bucket).iterdir())  # The write probe is gone.
  with pytest.raises(
    StorageError,
    match=r"^cannot use gs://no-such-bucket/runs/r1: bucket gs://no-such-bucket does "
    r"not exist \(create it with `gcloud storage buckets create gs://no-such-bucket`, or fix the "
    r"path\)$",
  ):
    storage.check([], writes=["gs://no-such-bucket/runs/r1"])


@pytest.fixture
def fresh_clients():
  storage.client.cache_clear()
  storage._check.cache_clear()  # pylint: disable=protected-access
  yield
  storage.client.cache_clear()
  storage._check.cache_clear()  # pylint: disable=protected-access


def test_check_without_credentials_says_how_to_get_them(gcs_emulator, fresh_clients, monkeypatch, tmp_path):
  """Off an emulator and off Google Cloud, with no application default credentials."""
  del gcs_emulator  # Imports gcsfs; its address is taken away below.
  monkeypatch.delenv("STORAGE_EMULATOR_HOST")
  monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
  monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # No gcloud credentials file.
  monkeypatch.setenv("NO_GCE_CHECK", "True")  # Not a Google Cloud VM: no metadata server.
  with pytest.raises(
    StorageError,
    match=r"^cannot write gs://bucket/runs/r1: no valid Google Cloud credentials\. Run "
    r"`gcloud auth application-default login`, or on a VM give its service account the storage "
    r"scope \(--scopes=cloud-platform\)$",
  ):
    storage.check([], writes=["gs://bucket/runs/r1"])


class _Forbidden(http.server.BaseHTTPRequestHandler):
  """Cloud Storage's answer to an account without permission, to every request."""

  def _deny(self):
    body = json.dumps({"error": {"code": 403, "message": "caller does not have storage.objects.list access"}})
    self.send_response(403)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body.encode())

  do_GET = do_POST = do_PUT = do_DELETE = _deny

  def log_message(self, *args):  # pylint: disable=arguments-differ
    pass


def test_check_without_permission_names_the_bucket(gcs_emulator, fresh_clients, monkeypatch):
  del gcs_emulator
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
  try:
    with pytest.raises(
      StorageError,
      match=r"^cannot read gs://private/data: permission denied on bucket gs://private "
      r"\(grant this account roles/storage\.objectAdmin on it\)$",
    ):
      storage.check(["gs://private/data"])
  finally:
    server.shutdown()


class _Flaky(http.server.BaseHTTPRequestHandler):
  """A proxy to the emulator that answers every `period`-th request with 503 Service Unavailable, as Cloud Storage
  does under load: the clients must retry it. `failed` counts those answers."""

  upstream = ""
  period = 3
  count = failed = 0
  lock = threading.Lock()

  @classmethod
  def every(cls, period: int) -> int:
    """Fails every `period`-th request from now on; the number failed so far."""
    with cls.lock:
      cls.period, cls.count = period, 0
      return cls.failed

  def _forward(self):
    with _Flaky.lock:
      _Flaky.count += 1
      fail = _Flaky.count % _Flaky.period == 0
      _Flaky.failed += fail
    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
    if fail:
      self._answer(503, {"Content-Type": "application/json"}, b'{"error": {"code": 503, "message": "try again"}}')
      return
    request = urllib.request.Request(
      self.upstream + self.path,
      data=body if body else None,
      method=self.command,
      headers={k: v for k, v in self.headers.items() if k.lower() != "host"},
    )
    try:
      with urllib.request.urlopen(request, timeout=30) as response:
        self._answer(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as e:
      self._answer(e.code, dict(e.headers), e.read())

  def _answer(self, status, headers, body):
    self.send_response(status)
    for key, value in headers.items():
      if key.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
        self.send_header(key, value)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _forward

  def log_message(self, *args):  # pylint: disable=arguments-differ
    pass


def test_transient_errors_are_retried(gcs_emulator, bucket, fresh_clients, monkeypatch, tmp_path):
  """Through a proxy that fails every 8th request of the whole-object writes, reads and the download cache, every
  third of the lease's conditional writes and every 40th of an Orbax checkpoint's: each succeeds, after failed
  requests (gcsfs's retried after jaxemb's backoff, here 0.1 s; Orbax's by TensorStore)."""
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel

  _Flaky.upstream = gcs_emulator.url
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
    monkeypatch.setenv(name, f"http://127.0.0.1:{server.server_port}")
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path))
  monkeypatch.setattr(storage, "FIRST_BACKOFF_SECONDS", 0.1)
  type(storage._filesystem()).clear_instance_cache()  # pylint: disable=protected-access  # The proxy's address.
  try:
    failed = _Flaky.every(8)
    for i in range(4):
      atomic.write_json(f"{bucket}/run/{i}.json", {"i": i})
    assert [json.loads(storage.path(f"{bucket}/run/{i}.json").read_text()) for i in range(4)] == [
      {"i": i} for i in range(4)
    ]
    assert sorted(p.name for p in storage.local_copy(f"{bucket}/run").iterdir()) == [f"{i}.json" for i in range(4)]
    assert _Flaky.every(3) > failed
    failed = _Flaky.failed
    generation = storage.create(f"{bucket}/run/lease", b"a")
    for _ in range(3):
      generation = storage.replace(f"{bucket}/run/lease", b"b", generation)
    assert storage.read_object(f"{bucket}/run/lease")[:2] == (b"b", generation)
    assert _Flaky.every(40) > failed
    failed = _Flaky.failed
    manager = ocp.CheckpointManager(storage.path(f"{bucket}/run/checkpoints"))
    manager.save(1, args=ocp.args.StandardSave({"w": jnp.arange(4.0)}))
    manager.wait_until_finished()
    assert list(manager.restore(1, args=ocp.args.StandardRestore())["w"]) == [0.0, 1.0, 2.0, 3.0]
    manager.close()
    assert _Flaky.failed > failed
  finally:
    server.shutdown()
    type(storage._filesystem()).clear_instance_cache()  # pylint: disable=protected-access


@pytest.fixture
def through_proxy(gcs_emulator, monkeypatch):
  """Every gs:// client of this process reaching the emulator through a Proxy (jaxemb/testing/gcs.py)."""
  from jaxemb.testing.gcs import Proxy  # pylint: disable=import-outside-toplevel

  proxy = Proxy(gcs_emulator.url)
  for name in ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL"):
    monkeypatch.setenv(name, proxy.url)
  type(storage._filesystem()).clear_instance_cache()  # pylint: disable=protected-access  # Its address read anew.
  yield proxy
  proxy.stop()
  type(storage._filesystem()).clear_instance_cache()  # pylint: disable=protected-access


def test_a_write_while_the_bucket_is_down_waits_says_so_and_goes_through_once_it_is_back(
  bucket, through_proxy, monkeypatch, capsys
):
  """gcsfs alone gives up after six tries in ~30 s (a metrics record then ended a run on a 40 s outage): each
  request is retried until its deadline, and one that waits says so in a line, and again when it goes through."""
  # A 1.25 s outage: tried at 0, 0.5 and 1.5 s (the backoff from 0.5 s), said at the first retry's failure.
  monkeypatch.setattr(storage, "FIRST_BACKOFF_SECONDS", 0.5)
  monkeypatch.setattr(storage, "WAIT_NOTICE_SECONDS", 0.5)
  through_proxy.down()
  threading.Timer(1.25, through_proxy.restore).start()
  started = time.monotonic()
  atomic.write_text(f"{bucket}/run/metrics.jsonl", "{}\n")
  assert 1.25 <= time.monotonic() - started < 15
  assert storage.path(f"{bucket}/run/metrics.jsonl").read_text() == "{}\n"
  waiting, through = capsys.readouterr().err.splitlines()
  assert re.fullmatch(
    rf"waiting for {bucket}/run/metrics.jsonl \(ClientConnectorError: .*\): retrying for up to 11\d s", waiting
  ), waiting
  assert re.fullmatch(rf"{bucket}/run/metrics.jsonl went through after [2-9] s", through), through


class _Guard:
  """A lease as storage.check_writes sees it."""

  def __init__(self, seconds):
    self.deadline, self.lost = time.monotonic() + seconds, False

  def check(self):
    if self.lost:
      raise WorkdirError("lost it")


def test_a_guarded_write_is_not_tried_once_the_guard_refuses_nor_retried_past_its_deadline(bucket, through_proxy):
  guard = _Guard(2.0)
  with storage.guarding_writes(guard):
    atomic.write_text(f"{bucket}/run/a", "a")
    guard.lost = True
    with pytest.raises(WorkdirError, match="^lost it$"):
      atomic.write_text(f"{bucket}/run/b", "b")
    guard.lost = False
    through_proxy.down()
    started = time.monotonic()
    with pytest.raises(StorageError, match=f"^cannot write {bucket}/run/c: "):
      atomic.write_text(f"{bucket}/run/c", "c")
    assert time.monotonic() - started < 3.0  # Not the 120 s of an unguarded write.
  through_proxy.restore()
  assert sorted(p.name for p in storage.path(f"{bucket}/run").iterdir()) == ["a"]
  storage.check_writes()  # No guard left.
