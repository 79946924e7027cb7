"""SentEval's transfer tasks as labelled sentences: MR, CR, SUBJ, MPQA, SST-2, TREC and MRPC.

Read from SentEval's `data/downstream` folder `root`, laid out as SentEval ships it:

    MR/rt-polarity.{pos,neg}       one sentence per line (latin-1); MR, CR, SUBJ and MPQA alike
    CR/custrev.{pos,neg}
    SUBJ/subj.{objective,subjective}
    MPQA/mpqa.{pos,neg}
    SST/binary/sentiment-{train,dev,test}       sentence <tab> label (0 or 1), UTF-8
    TREC/train_5500.label, TREC/TREC_10.label   COARSE:fine question (latin-1); the 6 coarse labels are kept
    MRPC/msr_paraphrase_{train,test}.txt        header line, then quality <tab> id <tab> id <tab> s1 <tab> s2 (UTF-8)

As SentEval's `BinaryClassifierEval`, `SSTEval`, `TRECEval` and `MRPCEval` read them:

- MR, CR, SUBJ, MPQA: every line is an example, blank lines included (CR has 4 and MPQA 3; SentEval embeds
  them as empty sentences, which is how it counts CR 3775 and MPQA 10606). Label 1 is the first file:
  positive, or for SUBJ objective. One split, "all", evaluated by 10-fold cross-validation.
- SST-2: splits train, dev and test.
- TREC: splits train and test; the label is the coarse class before ":", the fine class is dropped.
- MRPC: splits train and test of sentence pairs, label 1 = paraphrase.

Sentences are returned as stored, in file order; SentEval's whitespace join, its sort by length and the
prompt methods' `add_period` are applied by `jaxemb.evaluation.transfer`.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

import numpy as np

from jaxemb import storage
from jaxemb.data.lines import read_lines
from jaxemb.errors import ConfigError, DataError

TASKS = ("MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC")
BINARY_TASKS = ("MR", "CR", "SUBJ", "MPQA")
# Folder and the files of label 1 and label 0 (SentEval passes SUBJ's objective file as its "pos").
_BINARY_FILES = {
  "MR": ("rt-polarity.pos", "rt-polarity.neg"),
  "CR": ("custrev.pos", "custrev.neg"),
  "SUBJ": ("subj.objective", "subj.subjective"),
  "MPQA": ("mpqa.pos", "mpqa.neg"),
}
CLASSES = {
  **{name: ("negative", "positive") for name in ("MR", "CR", "MPQA", "SST2")},
  "SUBJ": ("subjective", "objective"),
  "TREC": ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"),  # SentEval's class ids, in this order.
  "MRPC": ("not paraphrase", "paraphrase"),
}
_SST_FILES = {"train": "sentiment-train", "dev": "sentiment-dev", "test": "sentiment-test"}
_TREC_FILES = {"train": "train_5500.label", "test": "TREC_10.label"}
_MRPC_FILES = {"train": "msr_paraphrase_train.txt", "test": "msr_paraphrase_test.txt"}


@dataclasses.dataclass(frozen=True)
class TransferSplit:
  """Labelled examples: `columns` holds one list of sentences per sentence of an example (two for MRPC pairs)."""

  columns: tuple[list[str], ...]
  labels: np.ndarray  # int64 class ids, indexing the task's `classes`.

  def __post_init__(self):
    object.__setattr__(self, "labels", np.asarray(self.labels, dtype=np.int64))
    sizes = {len(column) for column in self.columns}
    if not self.columns or sizes != {len(self.labels)}:
      raise ValueError(f"columns of {[len(c) for c in self.columns]} sentences for {len(self.labels)} labels")

  def __len__(self) -> int:
    return len(self.labels)


@dataclasses.dataclass(frozen=True)
class TransferTask:
  """One task: "all" (cross-validated), "train"/"test" or "train"/"dev"/"test" splits, and its class names."""

  name: str
  classes: tuple[str, ...]
  splits: dict[str, TransferSplit]

  @property
  def num_classes(self) -> int:
    return len(self.classes)


def load_transfer_task(root: storage.PathLike, name: str) -> TransferTask:
  """Reads one task (a name in TASKS) from SentEval's downstream folder `root` (local, or gs://: the task's folder
  copied into the download cache, once per host)."""
  if name not in TASKS:
    raise ConfigError(f"unknown transfer task {name!r}; expected one of {TASKS}")
  remote = storage.path(root) / ("SST/binary" if name == "SST2" else name)
  folder = storage.find_local(remote)
  if folder is None or not folder.is_dir():
    raise DataError(f"{remote}: no such directory (looked for {name} in SentEval's downstream layout)")
  if name in BINARY_TASKS:
    positive, negative = (read_lines(folder / file, "latin-1") for file in _BINARY_FILES[name])
    splits = {
      "all": TransferSplit(([line for _, line in positive + negative],), [1] * len(positive) + [0] * len(negative))
    }
  elif name == "SST2":
    splits = {split: _read_table(folder / file, 2, (0,), 1, header=False) for split, file in _SST_FILES.items()}
  elif name == "TREC":
    splits = {split: _read_trec(folder / file) for split, file in _TREC_FILES.items()}
  else:  # MRPC: quality <tab> #1 ID <tab> #2 ID <tab> #1 String <tab> #2 String, after a header line.
    splits = {split: _read_table(folder / file, 5, (3, 4), 0, header=True) for split, file in _MRPC_FILES.items()}
  return TransferTask(name, CLASSES[name], splits)


def load_transfer_tasks(root: storage.PathLike, names: Sequence[str] = TASKS) -> list[TransferTask]:
  """The named tasks; by default the seven of SentEval's transfer set (SimCSE's `--task_set transfer`)."""
  return [load_transfer_task(root, name) for name in names]


def _read_table(
  path: pathlib.Path, columns: int, sentences: tuple[int, ...], label: int, header: bool
) -> TransferSplit:
  """A tab-separated UTF-8 table (SST-2, MRPC): the sentences and the 0/1 label in the given columns."""
  lines = read_lines(path, "utf-8")[int(header) :]
  if not lines:
    raise DataError(f"{path}: no examples after the header line")
  rows = [(lineno, _fields(line, path, lineno, columns)) for lineno, line in lines]
  return TransferSplit(
    tuple([fields[column] for _, fields in rows] for column in sentences),
    [_label(fields[label], path, lineno) for lineno, fields in rows],
  )


def _read_trec(path: pathlib.Path) -> TransferSplit:
  """COARSE:fine question per line; the question is what follows the first space."""
  questions, labels = [], []
  for lineno, line in read_lines(path, "latin-1"):
    label, _, rest = line.strip().partition(":")
    _, space, question = rest.partition(" ")
    if label not in CLASSES["TREC"] or not space:
      raise DataError(
        f"{path}:{lineno}: expected 'COARSE:fine question' with COARSE one of {CLASSES['TREC']}, found {line[:80]!r}"
      )
    questions.append(question)
    labels.append(CLASSES["TREC"].index(label))
  return TransferSplit((questions,), labels)


def _fields(line: str, path: pathlib.Path, lineno: int, count: int) -> list[str]:
  fields = line.strip().split("\t")  # SentEval strips the line before splitting it at tabs.
  if len(fields) != count:
    raise DataError(f"{path}:{lineno}: expected {count} tab-separated columns, found {len(fields)}")
  return fields


def _label(text: str, path: pathlib.Path, lineno: int) -> int:
  if text.strip() not in ("0", "1"):
    raise DataError(f"{path}:{lineno}: the label {text!r} is not 0 or 1")
  return int(text)
