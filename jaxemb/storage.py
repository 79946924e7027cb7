"""Where a path points: a local file or a Cloud Storage object (gs://bucket/key), one `Path` type for both.

etils.epath is the path of the JAX ecosystem (Orbax, JAX's compilation cache and TensorStore take it; it comes
with orbax-checkpoint), so a run directory in a bucket goes to them as it is. Its gs:// backend is gcsfs, an
optional dependency (`pip install gcsfs`); the checks and the lease of a run directory use google-cloud-storage,
which gcsfs brings. Cloud Storage has no folders, no renames and no locks, so here:

- a folder needs no creating (and is not created: gcsfs would create a missing bucket);
- a file is written whole by one upload (`jaxemb.atomic`): an upload a kill interrupts leaves no object;
- what a library reads from local paths only (tokenizers, safetensors, `datasets`) is copied once per host into
  the download cache (`local_copy`), and fetched again only when its objects change;
- what is built with local tools (an archive unpacked) is built in a local folder and uploaded file by file
  (`local_folder`, or `staging` and `upload` where the work must survive a kill); a listing gives each object's
  size and MD5 without reading it (`objects`);
- an object is created only if absent, or replaced only if unchanged since it was read (`create`, `replace`), which
  is what the run directory's lease is built on (`jaxemb.training.workdir`).

Every gs:// path a command uses is checked before any work starts (`check`): the package, the credentials, the
bucket and the permission, each a one-line StorageError saying what to do. Transient errors (HTTP 429 and 5xx, a
dropped connection) are retried by gcsfs, google-cloud-storage and TensorStore, with backoff.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import socket
import tempfile
import time
from typing import IO, Any, Callable, Iterable, Iterator

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
  return gcsfs


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


def read_object(url: str) -> tuple[bytes, int, float] | None:
  """(contents, generation, seconds since it was written, by the server's clock as far as the local clock agrees)
  of a gs:// object; None when there is none."""
  from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top

  blob = client().bucket(split(url)[0]).get_blob(split(url)[1])
  if blob is None:
    return None
  try:
    data = blob.download_as_bytes(if_generation_match=blob.generation)
  except (api.NotFound, api.PreconditionFailed):  # Replaced or deleted between the two requests: read it again.
    return read_object(url)
  return data, blob.generation, time.time() - blob.updated.timestamp()


def create(url: str, data: bytes) -> int:
  """Creates the gs:// object `url` if there is none; its generation. Raises Conflict when there is one."""
  return replace(url, data, 0)


def replace(url: str, data: bytes, generation: int) -> int:
  """Writes `data` to the gs:// object `url` only if it is still at `generation` (0: absent); the new generation.
  Raises Conflict when another writer got there first."""
  from google.api_core import exceptions as api  # pylint: disable=g-import-not-at-top

  blob = client().bucket(split(url)[0]).blob(split(url)[1])
  try:
    blob.upload_from_string(data, if_generation_match=generation)
  except api.PreconditionFailed:
    raise Conflict(url) from None
  return blob.generation


def local_copy(value: PathLike) -> pathlib.Path:
  """A local path to read `value` from: the path itself when it is local; a gs:// file or folder copied into the
  download cache ($JAXEMB_DOWNLOADS, default ~/.cache/jaxemb/downloads) as <bucket>/<key>.

  Each host fetches an object once: what was fetched (each object's generation) is recorded, and a later call
  fetches only the objects that changed, appeared or are missing locally. Each file lands whole (written beside
  its place, then renamed), so a kill leaves nothing a later call takes for fetched.

  Raises:
    FileNotFoundError: no object has that name or that prefix.
    StorageError: as `check`.
  """
  if not is_remote(value):
    return pathlib.Path(os.path.expanduser(os.fspath(value)))
  url = os.fspath(value).rstrip("/")
  fs = _gcsfs().GCSFileSystem()
  generations = {name: info.generation for name, info in objects(url).items()}
  local = _downloads().joinpath(*split(url))
  manifest = _downloads() / ".manifests" / (re.sub(r"[^A-Za-z0-9._-]", "_", url.split("://", 1)[1]) + ".json")
  fetched = _read_manifest(manifest)
  for name, generation in generations.items():
    target = local / name if name else local
    if fetched.get(name) != generation or not target.is_file():
      _fetch(fs, f"{url}/{name}" if name else url, target)
  if fetched != generations:
    replace_file(manifest, lambda f: f.write(json.dumps(generations).encode()))
  return local


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


def objects(value: PathLike) -> dict[str, Object]:
  """The objects at the gs:// path `value`, by name under it ("" for `value` itself when it is an object), from
  one listing (one request per page of 1,000 objects): sizes and digests of a whole folder without a download.

  Raises:
    FileNotFoundError: no object has that name or that prefix.
    StorageError: as `check`.
  """
  url = os.fspath(value).rstrip("/")
  fs = _gcsfs().GCSFileSystem()
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


def _read_manifest(manifest: pathlib.Path) -> dict[str, str]:
  try:
    return json.loads(manifest.read_text())
  except (OSError, ValueError):
    return {}


def _fetch(fs: Any, url: str, target: pathlib.Path):
  def copy(f):
    with fs.open(url, "rb") as source:
      shutil.copyfileobj(source, f, 2**22)

  replace_file(target, copy)


def replace_file(target: pathlib.Path, fill: Callable[[IO[bytes]], Any]):
  """Calls `fill` on a temporary binary file beside the local file `target` (its folder created), then renames it
  into place: `target` is replaced whole or left as it was. The temporary file has a unique name (concurrent
  writers do not share one) and is removed whatever fails, closing it included (a full disk often shows only when
  the last buffer is flushed)."""
  target.parent.mkdir(parents=True, exist_ok=True)
  f = tempfile.NamedTemporaryFile(dir=target.parent, prefix=target.name + ".", suffix=".partial", delete=False)
  try:
    with f:
      fill(f)
    os.replace(f.name, target)
  except BaseException:
    if os.path.exists(f.name):
      os.unlink(f.name)
    raise


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
