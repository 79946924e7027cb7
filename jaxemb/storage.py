"""Where a path points: a local file or a Cloud Storage object (gs://bucket/key), one `Path` type for both.

etils.epath is the path of the JAX ecosystem (Orbax, JAX's compilation cache and TensorStore take it; it comes
with orbax-checkpoint), so a run directory in a bucket goes to them as it is. Its gs:// backend is gcsfs, an
optional dependency (`pip install gcsfs`); the checks and the lease of a run directory use google-cloud-storage,
which gcsfs brings. Cloud Storage has no folders, no renames and no locks, so here:

- a folder needs no creating (and is not created: gcsfs would create a missing bucket);
- a file is written whole by one upload (`jaxemb.atomic`): an upload a kill interrupts leaves no object;
- what a library reads from local paths only (tokenizers, safetensors, `datasets`) is copied once per host into
  the download cache (`local_copy`), and fetched again when its objects change or a copy no longer matches the
  size and digest their listing gives;
- what is built with local tools (an archive unpacked) is built in a local folder and uploaded file by file
  (`local_folder`, or `staging` and `upload` where the work must survive a kill); a listing gives each object's
  size and MD5 without reading it (`objects`);
- an object is created only if absent, or replaced only if unchanged since it was read (`create`, `replace`), which
  is what the run directory's lease is built on (`jaxemb.training.workdir`).

Every gs:// path a command uses is checked before any work starts (`check`): the package, the credentials, the
bucket and the permission, each a one-line StorageError saying what to do. Transient errors (HTTP 429 and 5xx, a
dropped connection) are retried with backoff: every gcsfs request (etils.epath's, Orbax's) until a deadline, that of
the lease of a run directory this process holds or RETRY_SECONDS, saying so when it waits; TensorStore's and
google-cloud-storage's by themselves. While a run holds its lease, every write to a bucket passes its check first
(`check_writes`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import functools
import hashlib
import json
import os
import pathlib
import re
import socket
import sys
import tempfile
import time
import urllib.parse
from typing import IO, Any, Callable, Iterable, Iterator, Protocol

from etils import epath

from jaxemb.errors import ConfigError, StorageError

Path = epath.Path
PathLike = str | os.PathLike
REMOTE_SCHEMES = ("gs",)
# The download cache of `local_copy`: <root>/<bucket>/<key>, with what was fetched in <root>/.manifests, and what
# is built for a bucket in <root>/.staging (bucket names start with a letter or a digit).
DOWNLOADS_ENV = "JAXEMB_DOWNLOADS"
DEFAULT_DOWNLOADS = "~/.cache/jaxemb/downloads"
# Set by Google's emulators and by tests (fake-gcs-server): Cloud Storage's JSON API at this URL.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
_INSTALL = "reading and writing gs:// paths needs gcsfs: pip install gcsfs"


def scheme(value: PathLike) -> str | None:
  """The URL scheme of `value` ("gs" for gs://bucket/key), None for a local path."""
  match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", os.fspath(value))
  return match.group(1).lower() if match else None


def is_remote(value: PathLike) -> bool:
  return scheme(value) is not None


def path(value: PathLike) -> Path:
  """`value` as a Path: a local path with `~` expanded, or a gs:// URL.

  Raises:
    ConfigError: a URL of another scheme (hdfs://, s3://, ...).
    StorageError: a gs:// URL without gcsfs installed.
  """
  if isinstance(value, epath.Path):
    return value
  text = os.fspath(value)
  found = scheme(text)
  if found is None:
    return epath.Path(os.path.expanduser(text))
  if found not in REMOTE_SCHEMES:
    raise ConfigError(f"{text}: {found}:// paths are not supported; use a local path or gs://bucket/...")
  _gcsfs()
  return epath.Path(text)


def split(value: PathLike) -> tuple[str, str]:
  """(bucket, key) of gs://bucket/key."""
  bucket, _, key = os.fspath(value).split("://", 1)[1].partition("/")
  return bucket, key.rstrip("/")


@functools.cache
def _gcsfs():
  """gcsfs, imported once; a StorageError saying to install it when it is missing."""
  if os.environ.get(EMULATOR_ENV):
    # An emulator has no control plane: gcsfs's probe of each bucket's layout would warn at every call. TensorStore
    # (Orbax's arrays) is pointed at the emulator as the other clients are.
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", os.environ[EMULATOR_ENV])
  try:
    import fsspec.config  # pylint: disable=g-import-not-at-top
    import gcsfs  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise StorageError(_INSTALL) from None
  # Every gs:// filesystem (etils.epath's and Orbax's through it, JAX's compilation cache, ours) lists a bucket
  # afresh: gcsfs would answer from a process's earlier listing of a folder, which misses what other hosts,
  # processes and clients (TensorStore) wrote since (a step another host saved, a chunk of the token cache).
  fsspec.config.conf.setdefault("gs", {})["use_listings_cache"] = False
  retrying = _retrying_filesystem(gcsfs.GCSFileSystem)
  for protocol in retrying.protocol:
    fsspec.register_implementation(protocol, retrying, clobber=True)
  return gcsfs


def _filesystem() -> Any:
  """The gs:// filesystem every library here reaches through fsspec (the retrying one of `_retrying_filesystem`)."""
  _gcsfs()
  import fsspec  # pylint: disable=g-import-not-at-top

  return fsspec.filesystem("gs")


# How long a failing request to a bucket is retried, with backoff, when no lease this process holds sets an earlier
# deadline (`guarding_writes`): an outage this long is ridden out. A request that has waited WAIT_NOTICE_SECONDS
# says so in one line, and again once it goes through.
RETRY_SECONDS = 120.0
WAIT_NOTICE_SECONDS = 10.0
# The wait before a failed request's first retry, doubled at each next one up to _MAX_BACKOFF_SECONDS.
FIRST_BACKOFF_SECONDS = 1.0
_MAX_BACKOFF_SECONDS = 8.0


class WriteGuard(Protocol):
  """What every write to a bucket passes first (`check_writes`): a lease this process holds on a run directory."""

  @property
  def deadline(self) -> float:
    """The time.monotonic() until which the holder may write and a failing request may be retried."""

  def check(self):
    """Raises (or ends the process) once the holder must not write any more."""


_GUARDS: list[WriteGuard] = []


@contextlib.contextmanager
def guarding_writes(guard: WriteGuard) -> Iterator[None]:
  """Within the block every write to a bucket passes `guard.check()` first, and no failing request is retried past
  `guard.deadline`."""
  _GUARDS.append(guard)
  try:
    yield
  finally:
    _GUARDS.remove(guard)


def check_writes():
  """The one check before anything is written to a bucket (an object by gcsfs, a checkpoint by Orbax): a process
  whose lease on its run directory is lost, or past its deadline, writes nothing more (`jaxemb.lease`)."""
  for guard in list(_GUARDS):
    guard.check()


def _retry_deadline(started: float) -> float:
  return min([guard.deadline for guard in _GUARDS], default=started + RETRY_SECONDS)


def _retrying_filesystem(base: type) -> type:
  """gcsfs's filesystem with each request retried until `_retry_deadline` (gcsfs gives up after six tries in ~30
  s, so an Orbax save or a metrics record died on a short outage), and each write checked (`check_writes`) before
  every try. Registered for gs:// in fsspec: etils.epath, Orbax and JAX's compilation cache take it from there."""
  request = getattr(base._request, "__wrapped__", base._request)  # pylint: disable=protected-access

  class RetryingGCSFileSystem(base):
    async def _request(self, method, path, *args, **kwargs):
      attempt = functools.partial(request, self, method, path, *args, **kwargs)
      url = _request_url(self._format_path(path, args), kwargs)
      return await _retrying(attempt, method.upper() not in ("GET", "HEAD"), url)

  return RetryingGCSFileSystem


async def _retrying(attempt: Callable[[], Any], writes: bool, url: str) -> Any:
  """`attempt()`'s result, retried with backoff on a transient failure (a dropped connection, HTTP 408, 429, 5xx)
  until `_retry_deadline`; one that a lease's deadline ends waits for it and ends in its fence."""
  import asyncio  # pylint: disable=g-import-not-at-top

  started, backoff, said = time.monotonic(), FIRST_BACKOFF_SECONDS, False
  while True:
    if writes:
      check_writes()
    try:
      result = await attempt()
    except Exception as e:  # pylint: disable=broad-except  # Anything but a transient failure is raised at once.
      now, deadline = time.monotonic(), _retry_deadline(started)
      if not _transient(e):
        raise
      if now + backoff > deadline:
        if _GUARDS:  # A lease's deadline: its fence, not this error, stops the process (check_writes raises).
          await asyncio.sleep(max(deadline - now, 0))
          check_writes()
        raise
      if not said and now - started >= WAIT_NOTICE_SECONDS:
        said = True
        _notice(f"waiting for {url} ({_cause(e)}): retrying for up to {_retry_deadline(started) - now:.0f} s")
      await asyncio.sleep(backoff)
      backoff = min(2 * backoff, _MAX_BACKOFF_SECONDS)
      continue
    if said:
      _notice(f"{url} went through after {time.monotonic() - started:.0f} s")
    return result


def _transient(error: BaseException) -> bool:
  import asyncio  # pylint: disable=g-import-not-at-top

  from gcsfs import retry  # pylint: disable=g-import-not-at-top

  return isinstance(error, asyncio.TimeoutError) or retry.is_retriable(error)


def _request_url(url: str, kwargs: dict) -> str:
  """The gs:// URL of the object (or the listing's prefix) a gcsfs request to the JSON API's `url` names."""
  parts = urllib.parse.urlsplit(url)
  found = re.search(r"/b/([^/]+)(?:/o/?([^?]*))?", parts.path)
  if not found:
    return url
  names = (urllib.parse.unquote(found.group(2) or ""), kwargs.get("name"), kwargs.get("prefix"))
  query = dict(urllib.parse.parse_qsl(parts.query))
  return f"gs://{found.group(1)}/{next((n for n in names if n), query.get('name', ''))}".rstrip("/")


def _cause(error: BaseException) -> str:
  return f"{type(error).__name__}: {' '.join(str(error).split())[:120]}"


def _notice(message: str):
  """A line on stderr beside a progress bar."""
  import tqdm  # pylint: disable=g-import-not-at-top

  tqdm.tqdm.write(message, file=sys.stderr)


@functools.cache
def client():
  """google-cloud-storage's client: anonymous against an emulator, else the application default credentials."""
  _gcsfs()
  from google.cloud import storage as gcs  # pylint: disable=g-import-not-at-top

  return gcs.Client(project="_") if not os.environ.get(EMULATOR_ENV) else gcs.Client()


def error(e: BaseException, url: str, action: str = "use") -> StorageError | None:
  """The one line for a Cloud Storage failure of `url` that a user can act on (credentials, permission, the
  service unreachable after the clients' retries); None for anything else."""
  from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions as auth  # pylint: disable=g-import-not-at-top

  if isinstance(e, (auth.DefaultCredentialsError, auth.RefreshError, api.Unauthorized)):
    return StorageError(
      f"cannot {action} {url}: no valid Google Cloud credentials. Run `gcloud auth "
      "application-default login`, or on a VM give its service account the storage scope "
      "(--scopes=cloud-platform)"
    )
  if isinstance(e, api.Forbidden):
    return StorageError(
      f"cannot {action} {url}: permission denied on bucket gs://{split(url)[0]} (grant this "
      "account roles/storage.objectAdmin on it)"
    )
  if isinstance(e, (api.GoogleAPICallError, api.RetryError, ConnectionError, TimeoutError)):
    return StorageError(f"cannot {action} {url}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
  return None


def check(paths: Iterable[PathLike], writes: Iterable[PathLike] = ()):
  """Checks, before any work starts, that each gs:// path can be read and each of `writes` written: the package,
  the credentials, the bucket and the permission (a probe object is written and deleted under each of `writes`).
  Local paths are left to the commands' own checks.

  Raises:
    StorageError: one line naming the path and what to do.
  """
  writes = [os.fspath(p) for p in writes if p and is_remote(p)]
  for url in dict.fromkeys([os.fspath(p) for p in paths if p and is_remote(p)] + writes):
    path(url)
    _check(url, url in writes)


@functools.cache
def _check(url: str, write: bool):
  bucket_name, key = split(url)
  try:
    bucket = client().bucket(bucket_name)
    next(iter(client().list_blobs(bucket, prefix=key, max_results=1)), None)
    if write:
      probe = bucket.blob(f"{key}/.jaxemb-write-check-{socket.gethostname()}-{os.getpid()}".lstrip("/"))
      probe.upload_from_string(b"")
      probe.delete()
  except Exception as e:  # pylint: disable=broad-except  # Anything but a user's error is re-raised.
    from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top

    if isinstance(e, api.NotFound):  # Listing a prefix finds no object without failing: the bucket is missing.
      raise StorageError(
        f"cannot use {url}: bucket gs://{bucket_name} does not exist (create it with `gcloud "
        f"storage buckets create gs://{bucket_name}`, or fix the path)"
      ) from None
    found = error(e, url, "write" if write else "read")
    if found is None:
      raise
    raise found from None


class Conflict(Exception):
  """The object changed (or appeared) since it was read: another process wrote it first."""


def read_object(url: str, timeout: float | None = None) -> tuple[bytes, int, float] | None:
  """(contents, generation, seconds since it was written, by the server's clock as far as the local clock agrees)
  of a gs:// object; None when there is none. With a `timeout`, each request is tried once, for that long."""
  from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top

  blob = client().bucket(split(url)[0]).get_blob(split(url)[1], **_one_try(timeout))
  if blob is None:
    return None
  try:
    data = blob.download_as_bytes(if_generation_match=blob.generation, **_one_try(timeout))
  except (api.NotFound, api.PreconditionFailed):  # Replaced or deleted between the two requests: read it again.
    return read_object(url, timeout)
  return data, blob.generation, time.time() - blob.updated.timestamp()


def create(url: str, data: bytes) -> int:
  """Creates the gs:// object `url` if there is none; its generation. Raises Conflict when there is one."""
  return replace(url, data, 0)


def replace(url: str, data: bytes, generation: int, timeout: float | None = None) -> int:
  """Writes `data` to the gs:// object `url` only if it is still at `generation` (0: absent); the new generation.
  Raises Conflict when another writer got there first. With a `timeout`, tried once, for that long (a lease's
  renewal: its heartbeat tries again on its own clock)."""
  from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top

  blob = client().bucket(split(url)[0]).blob(split(url)[1])
  try:
    blob.upload_from_string(data, if_generation_match=generation, **_one_try(timeout))
  except api.PreconditionFailed:
    raise Conflict(url) from None
  return blob.generation


def _one_try(timeout: float | None) -> dict[str, Any]:
  """google-cloud-storage's keywords for one try of at most `timeout` seconds; none (its retries) for None."""
  return {} if timeout is None else {"timeout": timeout, "retry": None}


def local_copy(value: PathLike) -> pathlib.Path:
  """A local path to read `value` from: the path itself when it is local; a gs:// file or folder copied into the
  download cache ($JAXEMB_DOWNLOADS, default ~/.cache/jaxemb/downloads) as <bucket>/<key> (`local_path`).

  Each host fetches an object once, and every call checks each copy against the size and digest that the listing
  gives (MD5; CRC32C for a composite object): a copy that differs (truncated or edited since) is fetched again,
  said in one line. A copy is hashed only when its modification time differs from the one recorded in the manifest
  when it was last verified (a stat otherwise); a download is hashed as it arrives. Each file lands whole and
  verified (written beside its place, checked, then renamed), so a library is never handed part of a file.

  Raises:
    FileNotFoundError: no object has that name or that prefix.
    StorageError: as `check`; a full disk under the download cache (the line names the file, the cache and
      JAXEMB_DOWNLOADS); a download that does not match its listing (the object replaced meanwhile).
  """
  if not is_remote(value):
    return local_path(value)
  url = os.fspath(value).rstrip("/")
  fs = _filesystem()
  local = local_path(url)
  manifest = _downloads() / ".manifests" / (re.sub(r"[^A-Za-z0-9._-]", "_", url.split("://", 1)[1]) + ".json")
  fetched = _read_manifest(manifest)
  verified = {}
  for name, listed in objects(url).items():
    target, source = (local / name, f"{url}/{name}") if name else (local, url)
    verified[name] = _verified_copy(target, source, listed, fetched.get(name)) or _fetch(fs, source, target, listed)
  if fetched != verified:
    with _cache_writes(url, manifest):
      replace_file(manifest, lambda f: f.write(json.dumps(verified).encode()))
  return local


def local_path(value: PathLike) -> pathlib.Path:
  """Where `local_copy` puts `value` (a local path: itself, `~` expanded), without fetching anything."""
  if not is_remote(value):
    return pathlib.Path(os.path.expanduser(os.fspath(value)))
  return _downloads().joinpath(*split(value))


def find_local(value: PathLike) -> pathlib.Path | None:
  """`local_copy(value)`, or None when nothing is there (no object by that name or prefix, no such local path)."""
  try:
    local = local_copy(value)
  except FileNotFoundError:
    return None
  return local if local.exists() else None


@dataclasses.dataclass(frozen=True)
class Object:
  """What a listing says of an object, without reading it."""

  size: int
  generation: str
  md5: str | None  # The hex MD5 that Cloud Storage computed of the contents; None for a composite object.
  crc32c: str | None = None  # The hex CRC32C (big-endian) of the contents, which every object has.


def objects(value: PathLike) -> dict[str, Object]:
  """The objects at the gs:// path `value`, by name under it ("" for `value` itself when it is an object), from
  one listing (one request per page of 1,000 objects): sizes and digests of a whole folder without a download.

  Raises:
    FileNotFoundError: no object has that name or that prefix.
    StorageError: as `check`.
  """
  url = os.fspath(value).rstrip("/")
  fs = _filesystem()
  try:
    is_file = fs.isfile(url)
    found = (
      [fs.info(url)] if is_file else [info for info in fs.find(url, detail=True).values() if info.get("type") == "file"]
    )
  except Exception as e:  # pylint: disable=broad-except  # Anything but a user's error is re-raised.
    user = error(e, url, "read") or (e if isinstance(e, OSError) else None)
    if user is None:
      raise
    raise user from None
  prefix = split(url)[1]
  named = {"" if is_file else info["name"].split("/", 1)[1][len(prefix) :].lstrip("/"): info for info in found}
  listed = {
    name: Object(
      int(info["size"]),
      str(info.get("generation")),
      base64.b64decode(info["md5Hash"]).hex() if info.get("md5Hash") else None,
      base64.b64decode(info["crc32c"]).hex() if info.get("crc32c") else None,
    )
    for name, info in named.items()
    if (name or is_file) and not name.endswith("/")
  }
  if not listed:
    raise FileNotFoundError(f"{url}: no such file or folder")
  return listed


def _downloads() -> pathlib.Path:
  """The root of the download cache: $JAXEMB_DOWNLOADS, default ~/.cache/jaxemb/downloads."""
  return pathlib.Path(os.path.expanduser(os.environ.get(DOWNLOADS_ENV) or DEFAULT_DOWNLOADS))


def staging(value: PathLike) -> pathlib.Path:
  """A local path to build the gs:// file or folder `value` in before it is uploaded (`upload`): <download
  cache>/.staging/<bucket>/<key>. It stays until its user removes it, so what a killed run left there (a partial
  download) is found again by the next run on this host."""
  return _downloads() / ".staging" / pathlib.Path(*split(value))


def _read_manifest(manifest: pathlib.Path) -> dict[str, Any]:
  """{name: {"generation", "mtime_ns"}} of the copies verified under one local_copy; {} for none. An older jaxemb's
  manifest gives each name's generation alone."""
  try:
    return json.loads(manifest.read_text())
  except (OSError, ValueError):
    return {}


def _verified_copy(target: pathlib.Path, url: str, listed: Object, recorded: Any) -> dict[str, Any] | None:
  """The manifest's record of `target` when it is a whole copy of the object `listed` (at `url`); None when it is to
  be fetched: absent, or not of the listed size and digest (said when it was verified as a copy of that object).
  The file is read only when it is not as it was when last verified (its generation and mtime in `recorded`)."""
  recorded = recorded if isinstance(recorded, dict) else {"generation": recorded}  # An older manifest's.
  this_object = recorded.get("generation") == listed.generation
  try:
    stat = target.stat()
  except FileNotFoundError:
    return None
  verified = {"generation": listed.generation, "mtime_ns": stat.st_mtime_ns}
  if stat.st_size != listed.size:
    differs = f"{stat.st_size:,} bytes, {listed.size:,} listed"
  elif this_object and recorded.get("mtime_ns") == stat.st_mtime_ns:  # Untouched since it was verified.
    return recorded
  elif (check := _digest_check(listed)) is None:
    return verified if this_object else None  # No digest to check it by (Cloud Storage always gives one).
  else:
    kind, expected, digest = check
    _read_into(target, [digest])
    if digest.digest().hex() == expected:
      return verified
    differs = f"{kind} {digest.digest().hex()}, {expected} listed"
  if this_object:  # A copy of another generation is stale, not damaged: fetched without a word.
    _notice(f"{target} in the download cache differs from {url} ({differs}): fetching it again")
  return None


_CHUNK_BYTES = 2**22


def file_digests(file: PathLike, *algorithms: str) -> dict[str, Any]:
  """{"size": its bytes, and the hex digest of each hashlib algorithm named ("sha256", "md5")} of a file, local or
  in a bucket, read once in chunks. Raises FileNotFoundError when it is not there."""
  hashers = {name: hashlib.new(name, usedforsecurity=False) for name in algorithms}
  size = _read_into(path(file), hashers.values())
  return {"size": size, **{name: hasher.hexdigest() for name, hasher in hashers.items()}}


def _read_into(file: PathLike, hashers: Iterable[Any]) -> int:
  """Feeds the bytes of `file` to each of `hashers` in chunks; returns how many there were."""
  size, hashers = 0, tuple(hashers)
  with path(file).open("rb") as f:
    while chunk := f.read(_CHUNK_BYTES):
      size += len(chunk)
      for hasher in hashers:
        hasher.update(chunk)
  return size


def _digest_check(listed: Object) -> tuple[str, str, Any] | None:
  """(the digest's name, the listed value in hex, an empty hasher) by which a copy of `listed` is checked: its MD5,
  or its CRC32C where Cloud Storage gives no MD5 (a composite object); None when the listing gives neither."""
  if listed.md5:
    return "md5", listed.md5, hashlib.md5(usedforsecurity=False)
  if listed.crc32c:
    import google_crc32c  # pylint: disable=g-import-not-at-top  # google-cloud-storage's, which gcsfs brings.

    return "crc32c", listed.crc32c, google_crc32c.Checksum()
  return None


def _fetch(fs: Any, url: str, target: pathlib.Path, listed: Object) -> dict[str, Any]:
  """Downloads the object `listed` at `url` to `target`, hashed as it arrives; the manifest's record of the copy.
  A download whose size or digest is not the listing's (the object replaced meanwhile) is not put in place."""
  check = _digest_check(listed)

  def copy(f):
    size = 0
    with fs.open(url, "rb") as source:
      while chunk := source.read(_CHUNK_BYTES):
        size += len(chunk)
        if check:
          check[2].update(chunk)
        f.write(chunk)
    got, want = f"{size:,} bytes", f"{listed.size:,} bytes"
    if check:
      got, want = f"{got}, {check[0]} {check[2].digest().hex()}", f"{want}, {check[0]} {check[1]}"
    if got != want:
      raise StorageError(
        f"the download of {url} ({got}) does not match its listing ({want}): the object changed while it was "
        "fetched; run the command again"
      )

  with _cache_writes(url, target):
    replace_file(target, copy)
  return {"generation": listed.generation, "mtime_ns": target.stat().st_mtime_ns}


# What the file system says when the download cache's disk is full (or a quota or file-size limit is reached).
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# The process's umask, read once at import (reading it means setting it, which another thread's file would see).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def _cache_writes(url: str, target: pathlib.Path) -> Iterator[None]:
  """A full disk while the download cache writes `target` (for `url`) as one line: the file, the cache and the
  variable that moves it (replace_file has removed what it began)."""
  try:
    yield
  except OSError as e:
    if e.errno not in _DISK_FULL:
      raise
    raise StorageError(
      f"cannot copy {url} into the download cache {_downloads()}: {e.strerror} (errno {e.errno}) writing {target}; "
      f"free space there, or set {DOWNLOADS_ENV} to a folder on a disk with room"
    ) from e


PARTIAL = ".partial"  # The suffix of replace_file's temporary files.


def replace_file(target: pathlib.Path, fill: Callable[[IO[bytes]], Any]):
  """Calls `fill` on a temporary binary file beside the local file `target` (its folder created), then renames it
  into place: `target` is replaced whole or left as it was. The temporary file has a unique name (concurrent
  writers do not share one) and is removed whatever fails, closing it included (a full disk often shows only when
  the last buffer is flushed); its bytes reach the disk (fsync) before the rename, so a power loss leaves the old
  file or the new one, never an empty one under the new name. A kill leaves the temporary file (a folder's owner
  removes them: `remove_partial_files`). `target` gets the permissions a plain write gives it (tempfile's are the
  owner's alone): its own if it exists, else those the process's umask leaves (others may read an export or
  embeddings on a shared disk)."""
  target.parent.mkdir(parents=True, exist_ok=True)
  mode = target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~_UMASK
  f = tempfile.NamedTemporaryFile(dir=target.parent, prefix=target.name + ".", suffix=PARTIAL, delete=False)
  try:
    with f:
      os.fchmod(f.fileno(), mode)
      fill(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(f.name, target)
  except BaseException:
    if os.path.exists(f.name):
      os.unlink(f.name)
    raise


def remove_partial_files(folder: pathlib.Path, stem: str = "") -> list[pathlib.Path]:
  """Removes the temporary files of `replace_file` that a killed writer left directly in the local folder `folder`
  (if `stem` is given, those of the files named `stem` or `stem`.* alone); the removed ones. Called only by their
  owner (a run holding its workdir's lock; the one process those files are written by): another process's write in
  flight would lose its file."""
  pattern = f"{stem}.*{PARTIAL}" if stem else f"*{PARTIAL}"
  partial = sorted(folder.glob(pattern)) if folder.is_dir() else []
  for path in partial:
    path.unlink(missing_ok=True)
  return partial


@contextlib.contextmanager
def local_folder(target: PathLike) -> Iterator[pathlib.Path]:
  """A local folder to write the files of the folder `target` with libraries that take local paths only (a
  tokenizer's save_pretrained, safetensors): `target` itself when it is local (created); for gs://, a temporary
  folder whose files are uploaded under `target` when the block ends without an error, each file one upload."""
  if not is_remote(target):
    local = pathlib.Path(os.path.expanduser(os.fspath(target)))
    local.mkdir(parents=True, exist_ok=True)
    yield local
    return
  with tempfile.TemporaryDirectory(prefix="jaxemb-upload-") as folder:
    yield pathlib.Path(folder)
    upload(pathlib.Path(folder), target)


def upload(local: pathlib.Path, target: PathLike):
  """Copies the local file `local` to `target`, or the files under the local folder `local` under it (in a bucket:
  each file one upload, so each object is whole or absent)."""
  files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
  for file in files:
    (path(target) / file.relative_to(local).as_posix() if file != local else path(target)).write_bytes(
      file.read_bytes()
    )
