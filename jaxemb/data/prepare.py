"""Fetches what a config reads: SentEval's data, SimCSE's training corpora and the model (prepare.py).

Each path comes from the config, so a config field (or $JAXEMB_DATA, the root of the configs' default data
paths) says where each thing is looked for and put:

    config.data.senteval_dir    every config        SimCSE's senteval.tar, unpacked in SentEval's data/downstream
                                                    layout (STS/, SICK/, MR/, ... MRPC/)
    config.data.train_file      training configs    wiki1m_for_simcse.txt (format "text") or nli_for_simcse.csv
                                                    ("nli")
    config.analysis.sample_file eval_analysis.py    wiki1m_for_simcse.txt
    config.model.path           every config        a local model or jaxemb run directory, a copy under
                                                    $JAXEMB_MODELS, or a hub id (`jaxemb.models.hf.resolve_model_dir`)

A path that exists is kept. Otherwise it is fetched from MANIFEST's public URL or, with `source`, copied from a
local folder (offline): `<source>/<name>` or `<source>/*/<name>`, the name being the configured file's name and
then the public one (for SentEval also an unpacked `senteval/` folder). Downloads stream to `<file>.part` and an
interrupted one resumes from the bytes already there (HTTP Range), within the run and on the next run. The public
files are checked against MANIFEST's size and sha256 where known; a mismatch is moved to `<file>.corrupt` and
reported. What was fetched is recorded in `<path>.lock.json` (size, sha256 and md5; for SentEval, of every
unpacked file), which later runs re-verify, so a second run with everything in place fetches nothing.

A path may be in a bucket (gs://). The file or the SentEval folder is then fetched into a local staging folder on
this host (`jaxemb.storage.staging`, where an interrupted download resumes), checked there, and uploaded file by
file (each object whole), its lock record last. A later run re-verifies the objects without reading them: their
sizes and MD5s, as one listing gives them, against the record. A gs:// model is checked where it is (config.json
and the name of a weights file), not downloaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
import contextlib
import dataclasses
import http.client
import json
import logging
import os
import pathlib
import pickle
import re
import shutil
import tarfile
from typing import Any
import urllib.error
import urllib.request
import zipfile

import tqdm

from jaxemb import atomic, storage
from jaxemb.errors import DataError, UserError
from jaxemb.models import EncoderConfig, hf
from jaxemb.models import run_dir
from jaxemb.spec import AnalysisRun, Architecture, EvaluationRun, TrainingRun

logger = logging.getLogger(__name__)

SIMCSE_URL = "https://huggingface.co/datasets/princeton-nlp/datasets-for-simcse/resolve/main/"


@dataclasses.dataclass(frozen=True)
class Artifact:
  """A public file: where it is downloaded from and, where known, its size in bytes and its sha256."""

  filename: str
  url: str
  size: int | None = None
  sha256: str | None = None


# The files of SimCSE's data/download_wiki.sh, data/download_nli.sh and SentEval/data/downstream/download_dataset.sh.
# Their sizes and digests could not be learned offline (None: not checked); each run records what it fetched in the
# lock file next to the data, and later runs check against that.
MANIFEST = {
  "senteval": Artifact("senteval.tar", SIMCSE_URL + "senteval.tar"),
  "wiki1m": Artifact("wiki1m_for_simcse.txt", SIMCSE_URL + "wiki1m_for_simcse.txt"),
  "nli": Artifact("nli_for_simcse.csv", SIMCSE_URL + "nli_for_simcse.csv"),
}
# The folder under SentEval's data/downstream that each task reads.
SENTEVAL_FOLDERS = {
  **{f"STS1{i}": f"STS/STS1{i}-en-test" for i in range(2, 7)},
  "STSBenchmark": "STS/STSBenchmark",
  "SICKRelatedness": "SICK",
  "MR": "MR",
  "CR": "CR",
  "SUBJ": "SUBJ",
  "MPQA": "MPQA",
  "SST2": "SST/binary",
  "TREC": "TREC",
  "MRPC": "MRPC",
}
_CORPUS_BY_FORMAT = {"text": "wiki1m", "nli": "nli"}
_CHUNK = 1 << 20
# Errors of a connection that broke or timed out; the download is resumed. (HTTP error statuses are not retried.)
_RETRIABLE = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError)
# The longest safetensors header read: the reference reader's limit (huggingface/safetensors
# `safetensors/src/tensor.rs` MAX_HEADER_SIZE).
_SAFETENSORS_MAX_HEADER = 100_000_000
_FETCH_AGAIN = "delete it and download the model again (prepare.py fetches a hub id anew)"


class PrepareError(UserError, RuntimeError):
  """Something a config needs that cannot be fetched or fails its check; the message names the file."""


@dataclasses.dataclass(frozen=True)
class Need:
  """One thing a config reads: its MANIFEST key, where it goes, and for SentEval the folders read under it."""

  key: str
  path: storage.Path  # Local or gs://.
  folders: tuple[str, ...] = ()


def needs(config: TrainingRun | EvaluationRun) -> list[Need]:
  """The data a run reads (not the model), each path once."""
  found = []
  if isinstance(config, TrainingRun):  # The corpus, and STS-B dev for model selection.
    if config.data.format not in _CORPUS_BY_FORMAT:
      raise PrepareError(f"config.data.format {config.data.format!r} is not one of {sorted(_CORPUS_BY_FORMAT)}")
    found.append(Need(_CORPUS_BY_FORMAT[config.data.format], storage.path(config.data.train_file)))
    found.append(_senteval(config.data.senteval_dir, ["STSBenchmark"]))
  elif config.data.source != "senteval":
    logger.warning(
      "config.data.source=%r: the SemEval releases under %s are not fetched by prepare.py",
      config.data.source,
      config.data.senteval_dir,
    )
  else:
    tasks = []
    if config.job != "transfer":  # STS-B dev is reported (or searched on) by every STS job.
      tasks += [*_split(config.eval.tasks), "STSBenchmark"]
    if "transfer" in config.job and config.transfer is not None:
      tasks += _split(config.transfer.tasks)
    found.append(_senteval(config.data.senteval_dir, tasks))
  if isinstance(config, AnalysisRun) and config.analysis.sample_file:
    found.append(Need("wiki1m", storage.path(config.analysis.sample_file)))
  return list({need.path: need for need in found}.values())


def _split(names: str) -> list[str]:
  return [name.strip() for name in names.split(",") if name.strip()]


def _senteval(path: str, tasks: Iterable[str]) -> Need:
  unknown = sorted(set(tasks) - set(SENTEVAL_FOLDERS))
  if unknown:
    raise PrepareError(f"unknown SentEval tasks {unknown}; known: {list(SENTEVAL_FOLDERS)}")
  return Need("senteval", storage.path(path), tuple(dict.fromkeys(SENTEVAL_FOLDERS[task] for task in tasks)))


def prepare(
  config: TrainingRun | EvaluationRun,
  source: str | os.PathLike | None = None,
  manifest: Mapping[str, Artifact] = MANIFEST,
  retries: int = 3,
) -> dict[str, str]:
  """Makes everything `config` reads exist and checks it; returns {path: what was done}.

  Args:
    config: a training run's or an evaluation's spec (configs/*.py, built by jaxemb.spec).
    source: a local folder to copy the data from instead of downloading it (offline); None = the public URLs.
    manifest: where each file is downloaded from and its known size and sha256 (MANIFEST; tests point it at a
      local server).
    retries: times a broken download is resumed within this call.

  Raises:
    PrepareError: naming the file, when it cannot be fetched or its size or sha256 is not what was expected.
    FileNotFoundError, hf.CheckpointError: when the model cannot be found or is not a model directory.
    DataError: naming the model's weights file, when it is truncated or corrupt (`check_weights`).
  """
  source = pathlib.Path(source) if source is not None else None
  if source is not None and not source.is_dir():
    raise PrepareError(f"source {source} is not a directory")
  wanted = needs(config)
  storage.check([], writes=[need.path.parent for need in wanted])  # Written to: a bucket's permission, before work.
  done = {}
  for need in wanted:
    prepare_one = _prepare_senteval if need.key == "senteval" else _prepare_file
    done[str(need.path)] = prepare_one(need, manifest[need.key], source, retries)
  if isinstance(config, TrainingRun) and config.model.architecture is not None:
    done[str(config.model.path)] = prepare_architecture(
      config.model.path, config.model.architecture, config.model.tie_word_embeddings
    )
  else:
    done[str(config.model.path)] = f"model in {prepare_model(config.model.path)}"
  return done


def prepare_architecture(path: str, architecture: Architecture, tie_word_embeddings: bool | None = None) -> str:
  """Writes the model directory of a run from scratch (configs/pretrain_mlm.py): config.json from the config's
  `model.architecture` (the BERT fields, the vocabulary size the tokenizer's) and `model.tie_word_embeddings` (None:
  HF's default, tied), and the tokenizer files of `architecture.tokenizer`, no weights (`hf.write_architecture`:
  `hf.load_pretrained` initialises them). A directory already there must hold the same architecture."""
  tokenizer = hf.load_tokenizer(architecture.tokenizer)
  fields = {k: v for k, v in dataclasses.asdict(architecture).items() if k != "tokenizer"}
  if tie_word_embeddings is not None:
    fields["tie_word_embeddings"] = tie_word_embeddings
  config = EncoderConfig(model_type="bert", vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **fields)
  out = storage.path(path)
  if (out / "config.json").is_file():
    if hf.read_config(out) != config:
      raise PrepareError(
        f"{out / 'config.json'} holds another architecture than config.model.architecture and "
        "model.tie_word_embeddings; delete the directory or point config.model.path elsewhere"
      )
    return f"architecture in {out} (already written)"
  hf.write_architecture(out, config, tokenizer)
  return f"architecture written to {out} (no weights: training initialises them from scratch)"


def prepare_model(name_or_path: str) -> storage.Path:
  """The model's directory: a jaxemb run directory, or a Hugging Face one (fetched from the hub for a hub id)
  that holds a readable config.json and weights. A gs:// one is checked in its bucket, by its config.json and the
  presence of a weights file: the runs copy it once per host when they start."""
  if run_dir.is_run_dir(name_or_path):
    return storage.path(name_or_path)
  if storage.is_remote(name_or_path):
    model_dir = storage.path(name_or_path)
    hf.read_config(model_dir)
    if not hf.has_weights(model_dir):
      raise _no_weights(model_dir)
    return model_dir
  model_dir = hf.resolve_model_dir(name_or_path)
  hf.read_config(model_dir)
  check_weights(model_dir)
  return model_dir


def check_weights(model_dir: pathlib.Path):
  """Checks the weights files of a Hugging Face model directory by their headers, without reading the tensors: a
  truncated or corrupt download is named now, not when a run loads it. Raises DataError naming the file."""
  if (model_dir / hf.SAFETENSORS).is_file():
    _check_safetensors(model_dir / hf.SAFETENSORS)
  elif (model_dir / hf.SAFETENSORS_INDEX).is_file():
    index = model_dir / hf.SAFETENSORS_INDEX
    try:
      shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
      raise DataError(f"{index}: not a safetensors index ({type(e).__name__}: {e}); {_FETCH_AGAIN}") from None
    for name in shards:
      if not (model_dir / name).is_file():
        raise DataError(f"{model_dir / name}: missing, though {index} lists it; {_FETCH_AGAIN}")
      _check_safetensors(model_dir / name)
  elif (model_dir / hf.TORCH_BIN).is_file():
    _check_torch_bin(model_dir / hf.TORCH_BIN)
  else:
    raise _no_weights(model_dir)


def _no_weights(model_dir: storage.PathLike) -> hf.CheckpointError:
  weights = (hf.SAFETENSORS, hf.SAFETENSORS_INDEX, hf.TORCH_BIN)
  return hf.CheckpointError(f"{model_dir}: no weights found (looked for {', '.join(weights)})")


def _check_safetensors(path: pathlib.Path):
  """The safetensors layout (huggingface/safetensors README, "Format"): an 8-byte little-endian header length N,
  N bytes of UTF-8 JSON starting with "{" ({name: {dtype, shape, data_offsets: [begin, end]}} and an optional
  "__metadata__"), then the tensor bytes, which the offsets index from the end of the header."""
  size = path.stat().st_size
  with open(path, "rb") as f:
    length = int.from_bytes(f.read(8), "little") if size >= 8 else None
    if length is None or length > min(size - 8, _SAFETENSORS_MAX_HEADER):
      raise _corrupt(
        path,
        f"{size} bytes, too short for its header"
        if length is None
        else f"its header length field says {length} bytes; the file has {size}",
      )
    raw = f.read(length)
  try:
    header = json.loads(raw.decode("utf-8")) if raw.startswith(b"{") else None
    end = max((int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"), default=0)
  except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError, ValueError):
    raise _corrupt(path, "its header is not a safetensors JSON header") from None
  if size < 8 + length + end:
    raise _corrupt(path, f"{size} bytes, but its header places tensor bytes up to byte {8 + length + end}")


def _check_torch_bin(path: pathlib.Path):
  """A PyTorch checkpoint: a zip holding data.pkl (torch.save since 1.6; the zip's directory is at its end, so a
  truncated file has none) or a legacy pickle (starting with pickle's PROTO opcode; its end is not checked)."""
  if zipfile.is_zipfile(path):
    try:
      with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as e:
      raise _corrupt(path, f"not a readable zip ({e})") from None
    if not any(name.endswith("data.pkl") for name in names):
      raise _corrupt(path, "a zip without the data.pkl of torch.save")
    return
  with open(path, "rb") as f:
    if f.read(1) != pickle.PROTO:
      raise _corrupt(path, "neither a whole zip (torch.save) nor a pickle")


def _corrupt(path: pathlib.Path, detail: str) -> DataError:
  return DataError(f"{path}: truncated or corrupt weights file ({detail}); {_FETCH_AGAIN}")


# ----------------------------------------------------------------------------------------------------------
# Files.


def _prepare_file(need: Need, artifact: Artifact, source: pathlib.Path | None, retries: int) -> str:
  path = need.path
  if path.is_file():
    locked, record = _lock_path(path).is_file(), _read_lock(path)
    if record is not None:
      _verify(path, record)
      return "verified"
    if not locked:
      return "present (not fetched by prepare.py, so not verified)"
  with _staged(path) as local:
    return _fetch_file(local, path, artifact, source, retries)


def _fetch_file(
  path: pathlib.Path, target: storage.Path, artifact: Artifact, source: pathlib.Path | None, retries: int
) -> str:
  """Downloads (or copies from `source`) the local file `path`, checks it and writes its lock record; `target` is
  where it is going (`path`, or the gs:// path it is staged for)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  part = path.with_name(path.name + ".part")
  if source is None:
    origin, expected = artifact.url, artifact
    _download(artifact.url, part, retries)
  else:
    names = list(dict.fromkeys([path.name, artifact.filename]))
    found = _find_local(source, names, pathlib.Path.is_file)
    if found is None:
      raise PrepareError(
        f"{target}: no {' or '.join(names)} under {source} or its subfolders (a config field names "
        "the file to use, e.g. --config.data.train_file)"
      )
    # MANIFEST describes the public file; a file under another name (a sample) has nothing to be checked against.
    origin, expected = str(found), artifact if found.name == artifact.filename else None
    _copy(found, part)
  record = {"source": origin, **_check_part(part, path, expected, origin)}
  _write_lock(path, record)
  return f"fetched from {origin}"


def _download(url: str, part: pathlib.Path, retries: int):
  """Streams `url` into `part`, continuing after the bytes already there, resuming up to `retries` times."""
  for attempt in range(retries + 1):
    try:
      _download_once(url, part)
      return
    except _RETRIABLE as e:
      have = part.stat().st_size if part.exists() else 0
      if attempt == retries:
        hint = (
          f"{part} keeps the {have} bytes received, and running again resumes from there"
          if have
          else "offline, copy the data from a local folder instead (prepare.py --source DIR)"
        )
        raise PrepareError(f"{url}: download failed ({type(e).__name__}: {e}); {hint}") from None
      logger.warning("%s: download broke off at %d bytes (%s); resuming", url, have, e)


def _download_once(url: str, part: pathlib.Path):
  offset = part.stat().st_size if part.exists() else 0
  request = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
  try:
    response = urllib.request.urlopen(request, timeout=60)
  except urllib.error.HTTPError as e:
    if e.code == 416 and offset:  # Nothing after `offset`: the part is whole when the file has `offset` bytes.
      if _range_total(e.headers.get("Content-Range")) == offset:
        return
      part.unlink()
      return _download_once(url, part)
    raise PrepareError(f"{url}: HTTP {e.code} {e.reason}") from None
  with response:
    if offset and response.status != 206:  # The server ignored the range and sends the whole file.
      offset = 0
    elif offset and _range_start(response.headers.get("Content-Range")) != offset:
      raise PrepareError(f"{url}: asked for bytes from {offset}, got {response.headers.get('Content-Range')!r}")
    length = response.headers.get("Content-Length")
    total = offset + int(length) if length is not None else None
    logger.info("downloading %s to %s%s", url, part, f" (resuming at byte {offset})" if offset else "")
    received = 0
    with (
      open(part, "ab" if offset else "wb") as f,
      tqdm.tqdm(total=total, initial=offset, unit="B", unit_scale=True, desc=part.name, disable=None) as bar,
    ):
      while chunk := response.read(_CHUNK):
        f.write(chunk)
        received += len(chunk)
        bar.update(len(chunk))
  if length is not None and received != int(length):  # http.client ends the body early without an error.
    raise ConnectionError(f"the connection closed after {received} of {length} bytes")


def _range_start(content_range: str | None) -> int | None:
  match = re.fullmatch(r"bytes (\d+)-\d+/(\d+|\*)", content_range or "")
  return int(match.group(1)) if match else None


def _range_total(content_range: str | None) -> int | None:
  match = re.fullmatch(r"bytes (?:\*|\d+-\d+)/(\d+)", content_range or "")
  return int(match.group(1)) if match else None


def _copy(found: pathlib.Path, part: pathlib.Path):
  """Copies a local file into `part`, continuing after the bytes already there."""
  offset = part.stat().st_size if part.exists() else 0
  logger.info("copying %s to %s", found, part)
  with open(found, "rb") as src, open(part, "ab") as dst:
    src.seek(offset)
    shutil.copyfileobj(src, dst, _CHUNK)


def _check_part(part: pathlib.Path, path: pathlib.Path, expected: Artifact | None, origin: str) -> dict[str, Any]:
  """Checks a fetched `part` against `expected` and moves it to `path`; returns its size and sha256."""
  record = _digest(part)
  if expected is not None:
    _compare(part, {"size": expected.size, "sha256": expected.sha256}, record, path, f" (from {origin})")
  part.replace(path)
  return record


def _verify(path: storage.Path, expected: Mapping[str, Any]):
  """Checks a file fetched earlier against its lock record."""
  _compare(path, expected, _stored(path, [""])[""], path, " (since it was fetched)")


def _compare(
  file: storage.Path, expected: Mapping[str, Any], actual: Mapping[str, Any], name: storage.Path, context: str
):
  """Moves `file` to `<name>.corrupt` and raises when a size or digest that both know differs."""
  for key in ("size", "sha256", "md5"):
    if expected.get(key) is not None and actual.get(key) is not None and expected[key] != actual[key]:
      corrupt = name.with_name(name.name + ".corrupt")
      file.replace(corrupt)
      raise PrepareError(
        f"{name}: {key} mismatch{context}: expected {expected[key]}, got {actual[key]}; moved "
        f"to {corrupt} (running again fetches it anew)"
      )


def _digest(path: pathlib.Path) -> dict[str, Any]:
  """Size, sha256 and md5 of a local file: sha256 is what a local file is checked by, md5 what a bucket lists of
  the object it is uploaded to."""
  return storage.file_digests(path, "sha256", "md5")


def _stored(root: storage.Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
  """The digests of the files `names` under `root` ("": `root` itself) that are there, by name: a local file's
  `_digest` (read whole); an object's size and md5 as one listing of `root` gives them (nothing is read)."""
  if not storage.is_remote(root):
    files = {name: pathlib.Path(root, name) if name else pathlib.Path(root) for name in names}
    return {name: _digest(file) for name, file in files.items() if file.is_file()}
  try:
    listed = storage.objects(root)
  except FileNotFoundError:
    return {}
  return {name: {"size": listed[name].size, "md5": listed[name].md5} for name in names if name in listed}


@contextlib.contextmanager
def _staged(path: storage.Path) -> Iterator[pathlib.Path]:
  """Where to fetch `path` (a file, or SentEval's folder) and write its lock record: `path` itself when it is
  local. For a gs:// path, its staging place on this host (`storage.staging`, kept when the block fails, so that a
  download resumes there), whose files are uploaded once the block ends, each object whole, the lock record last
  (as a local file is renamed into place before it), then removed."""
  if not storage.is_remote(path):
    yield pathlib.Path(path)
    return
  local = storage.staging(path)
  yield local
  storage.upload(local, path)
  storage.upload(_lock_path(local), _lock_path(path))
  if local.is_dir():
    shutil.rmtree(local)
  else:
    local.unlink()
  _lock_path(local).unlink()


def _lock_path(path: storage.Path) -> storage.Path:
  return path.with_name(path.name + ".lock.json")


def _read_lock(path: storage.Path) -> dict[str, Any] | None:
  """The lock record of `path` (a file, or SentEval's folder), None when there is none. One that does not read (a
  file garbled since it was written whole) is moved to `<lock>.corrupt` and said: `path` is then fetched anew."""
  lock = _lock_path(path)
  try:
    record = json.loads(lock.read_text())
  except FileNotFoundError:
    return None
  except ValueError as e:  # Not JSON, or not UTF-8.
    cause = str(e)
  else:
    if isinstance(record, dict) and (path.is_file() or isinstance(record.get("files"), dict)):
      return record
    cause = "not a lock record prepare.py writes"
  corrupt = lock.with_name(lock.name + ".corrupt")
  lock.rename(corrupt)
  logger.warning("%s is unreadable (%s); moved to %s: fetching %s anew", lock, cause, corrupt.name, path)
  return None


def _write_lock(path: pathlib.Path, record: Mapping[str, Any]):
  atomic.write_json(_lock_path(path), record, indent=1)


def _find_local(source: pathlib.Path, names: Iterable[str], test) -> pathlib.Path | None:
  """The first `<source>/<name>` or `<source>/*/<name>`, in the order of `names`, for which `test` holds."""
  for name in names:
    for candidate in [source / name, *sorted(source.glob(f"*/{name}"))]:
      if test(candidate):
        return candidate
  return None


# ----------------------------------------------------------------------------------------------------------
# SentEval.


def _prepare_senteval(need: Need, artifact: Artifact, source: pathlib.Path | None, retries: int) -> str:
  """SentEval's folder verified against its lock record, or fetched (copied or unpacked) file by file; a fetch a kill
  or a fault stopped leaves its `.unfinished` marker beside the folder, so that the next run fetches it again rather
  than take the folders it finds for data put there by hand."""
  path, lock, unfinished = need.path, _lock_path(need.path), need.path.with_name(need.path.name + ".unfinished")
  locked, record = lock.is_file(), _read_lock(path)
  if unfinished.exists():
    logger.warning("%s: an earlier prepare.py stopped while writing it; fetching again", path)
  elif record is not None:
    found = _stored(path, record["files"])
    missing = [name for name in record["files"] if name not in found]
    if not missing:
      for name, expected in record["files"].items():
        _compare(path / name, expected, found[name], path / name, " (since it was fetched)")
      return f"verified ({len(record['files'])} files)"
    logger.warning(
      "%s: %d files recorded in %s are missing (%s ...); fetching again", path, len(missing), lock, missing[0]
    )
  elif not locked and all((path / folder).is_dir() for folder in need.folders):
    return "present (not fetched by prepare.py, so not verified)"
  atomic.write_text(unfinished, "prepare.py is writing the folder beside this file; until it ends it is not whole\n")
  with _staged(path) as local:
    done = _fetch_senteval(local, need, artifact, source, retries)
  unfinished.unlink()
  return done


def _fetch_senteval(
  path: pathlib.Path, need: Need, artifact: Artifact, source: pathlib.Path | None, retries: int
) -> str:
  """Copies an unpacked SentEval folder from `source`, or fetches and unpacks the archive, into the local folder
  `path` (`need.path`, or where the gs:// one is staged) and writes its lock record."""
  has_folders = lambda root: all((root / folder).is_dir() for folder in need.folders)
  unpacked = _find_local(source, dict.fromkeys([path.name, "senteval"]), has_folders) if source is not None else None
  if unpacked is not None:
    files = _install(unpacked, path, move=False)
    record = {"source": str(unpacked)}
  else:
    archive, archive_lock = path.with_name(artifact.filename), _lock_path(path.with_name(artifact.filename))
    logger.info("%s: %s", archive, _prepare_file(Need(need.key, archive), artifact, source, retries))
    fetched = (
      json.loads(archive_lock.read_text()) if archive_lock.is_file() else {"source": str(archive), **_digest(archive)}
    )
    record = {
      "source": fetched["source"],
      "archive": {"name": archive.name, "size": fetched["size"], "sha256": fetched["sha256"]},
    }
    tmp = path.with_name(path.name + ".unpack")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(archive) as tar:
      tar.extractall(tmp, filter="data")  # "data": nothing outside `tmp`, no links out of it, no devices.
    root = next((d for d in [tmp, *sorted(tmp.iterdir())] if (d / "STS").is_dir()), None)
    if root is None:
      raise PrepareError(f"{archive}: no STS/ folder at the top or one level down; not SentEval's data")
    files = _install(root, path, move=True)
    shutil.rmtree(tmp)
    if archive_lock.is_file():  # Fetched here: unpacked, it is not needed any more (an archive put there is kept).
      archive.unlink()
      archive_lock.unlink()
  lacking = [folder for folder in need.folders if not (path / folder).is_dir()]
  if lacking:
    raise PrepareError(f"{need.path}: {record['source']} has no {', '.join(lacking)}")
  _write_lock(path, {**record, "files": files})
  return f"fetched from {record['source']} ({len(files)} files)"


def _install(root: pathlib.Path, path: pathlib.Path, move: bool) -> dict[str, dict[str, Any]]:
  """Puts the files under `root` under `path` (moved or copied; other files there are kept); returns each one's
  `_digest` by its path relative to `path`."""
  names = sorted(str(file.relative_to(root)) for file in root.rglob("*") if file.is_file())
  for name in names:  # Contents only: a copy of a read-only folder (../shared) stays writable.
    (path / name).parent.mkdir(parents=True, exist_ok=True)
    (shutil.move if move else shutil.copyfile)(root / name, path / name)
  return {name: _digest(path / name) for name in names}
