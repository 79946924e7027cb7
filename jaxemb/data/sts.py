"""SentEval's STS tasks as sentence pairs with gold scores: STS12-16, STS Benchmark and SICK-Relatedness.

The tasks and subsets are SentEval's (`STS12Eval` .. `STS16Eval`, `STSBenchmarkEval`, `SICKRelatednessEval`),
read from one of two sources laid out under `root`:

`source="senteval"`: SentEval's `data/downstream` folder (STS sentences tokenised and lowercased):

    STS/STS12-en-test/STS.input.<subset>.txt   two tab-separated sentences per line
    STS/STS12-en-test/STS.gs.<subset>.txt      one gold score per line; a blank line = pair not scored
    ... STS13-en-test, STS14-en-test, STS15-en-test, STS16-en-test alike
    STS/STSBenchmark/sts-{train,dev,test}.csv  7 tab-separated columns: genre, file, year, id, score, s1, s2
    SICK/SICK_{train,trial,test_annotated}.txt header line, then id, s1, s2, relatedness, entailment

`source="raw"`: the official SemEval releases (untokenised; cased but for STS14 deft-news and STS15 belief),
each unpacked as distributed:

    STS12-en-test/test-gold/STS.{input,gs}.<subset>.txt
    STS13-en-test/test-gs/STS.{input,gs}.<subset>.txt
    STS14-en-test/sts-en-test-gs-2014/STS.{input,gs}.<subset>.txt
    STS15-en-test/test_evaluation_task2a/STS.{input,gs}.<subset>.txt
    STS16-en-test/sts2016-english-with-gs-v1.0/STS2016.{input,gs}.<subset>.txt
        (4 columns: the two sentences, then where each came from; `.ascii` copies are ignored)
    STSBenchmark/stsbenchmark/sts-{train,dev,test}.csv  (as above; some rows add 2 licence columns)
    SICK/SICK_*.txt  (SentEval's SICK files are the official release unchanged, so both sources share
        this layout; copy or link SICK/ next to the raw STS folders to read it with source="raw")

Gold files are aligned line by line with their input files, and pairs with a blank gold line are dropped
(STS15 and STS16 ship unscored pairs), as SentEval does. Other files in these folders (STS12's
`STS.gs.ALL.txt`, the `STS.output.*` sample outputs, STS13's `STS.gs.SMT.txt`) are not read. Sentences are
returned exactly as stored; `join_tokens` and `add_period` are the test-time rules the evaluation applies.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Sequence

import numpy as np

from jaxemb import storage
from jaxemb.data.lines import read_lines
from jaxemb.errors import ConfigError, DataError  # DataError: a dataset file missing or malformed (named).

STS_YEARS = ("STS12", "STS13", "STS14", "STS15", "STS16")
TASKS = (*STS_YEARS, "STSBenchmark", "SICKRelatedness")
SOURCES = ("senteval", "raw")

# SentEval's subsets per year. STS13 has no SMT: its input file is licensed by the LDC and not redistributed.
SUBSETS = {
  "STS12": ("MSRpar", "MSRvid", "SMTeuroparl", "surprise.OnWN", "surprise.SMTnews"),
  "STS13": ("FNWN", "headlines", "OnWN"),
  "STS14": ("deft-forum", "deft-news", "headlines", "images", "OnWN", "tweet-news"),
  "STS15": ("answers-forums", "answers-students", "belief", "headlines", "images"),
  "STS16": ("answer-answer", "headlines", "plagiarism", "postediting", "question-question"),
}
# Raw release folder and file-name prefix of each year.
_RAW_YEARS = {
  "STS12": ("STS12-en-test/test-gold", "STS"),
  "STS13": ("STS13-en-test/test-gs", "STS"),
  "STS14": ("STS14-en-test/sts-en-test-gs-2014", "STS"),
  "STS15": ("STS15-en-test/test_evaluation_task2a", "STS"),
  "STS16": ("STS16-en-test/sts2016-english-with-gs-v1.0", "STS2016"),
}
_STSB_FOLDER = {"senteval": "STS/STSBenchmark", "raw": "STSBenchmark/stsbenchmark"}
_SICK_FILES = {"train": "SICK_train.txt", "dev": "SICK_trial.txt", "test": "SICK_test_annotated.txt"}
SPLITS = {
  **{name: ("test",) for name in STS_YEARS},
  "STSBenchmark": ("train", "dev", "test"),
  "SICKRelatedness": tuple(_SICK_FILES),
}


@dataclasses.dataclass(frozen=True)
class StsSubset:
  """Sentence pairs with their gold similarity scores (float64)."""

  name: str
  sentences1: list[str]
  sentences2: list[str]
  scores: np.ndarray

  def __post_init__(self):
    object.__setattr__(self, "scores", np.asarray(self.scores, dtype=np.float64))
    if not len(self.sentences1) == len(self.sentences2) == len(self.scores):
      raise ValueError(
        f"subset {self.name!r}: {len(self.sentences1)} first sentences, "
        f"{len(self.sentences2)} second sentences and {len(self.scores)} scores"
      )

  def __len__(self) -> int:
    return len(self.scores)


@dataclasses.dataclass(frozen=True)
class StsTask:
  """One task (e.g. STS12) at one split, as its subsets; STS Benchmark and SICK have one, named by the split."""

  name: str
  split: str
  subsets: dict[str, StsSubset]

  def __len__(self) -> int:
    return sum(len(subset) for subset in self.subsets.values())


def join_tokens(sentence: str) -> str:
  """SentEval's view of a sentence: split at whitespace and re-joined with single spaces.

  SentEval keeps each sentence as `s.split()` and the batchers of SimCSE and Prompt-BERT join the tokens
  with " ", so runs of spaces (and tabs, U+00A0) collapse and the ends are trimmed.
  """
  return " ".join(sentence.split())


def add_period(sentence: str) -> str:
  """Prompt-BERT's test-time rule: append "." unless the sentence ends in `.`, `?`, `"` or `'`.

  As kongds/Prompt-BERT evaluation.py (`batcher`, prompt branch) does to the joined sentence before filling
  the template: the "." goes on directly, with no space before it, and an empty sentence is left alone.
  """
  if sentence and sentence[-1] not in ".?\"'":
    return sentence + "."
  return sentence


def load_sts_task(root: storage.PathLike, name: str, split: str = "test", source: str = "senteval") -> StsTask:
  """Reads one task (a name in TASKS) at one split (see SPLITS) from `root` laid out as `source` says."""
  if name not in TASKS:
    raise ConfigError(f"unknown STS task {name!r}; expected one of {TASKS}")
  if split not in SPLITS[name]:
    raise ConfigError(f"{name} has no split {split!r}; it has {SPLITS[name]}")
  if source not in SOURCES:
    raise ConfigError(f"unknown source {source!r}; expected one of {SOURCES}")
  root = storage.path(root)
  if name in STS_YEARS:
    subsets = _load_year(root, name, source)
  elif name == "STSBenchmark":
    folder = _folder(root / _STSB_FOLDER[source], name, source)
    # The score is column 5 and the sentences columns 6-7, as SentEval reads them; the raw release adds two
    # licence columns to some rows.
    columns = (7,) if source == "senteval" else (7, 9)
    subsets = [_load_table(folder / f"sts-{split}.csv", split, columns, score=4, first=5, header=False)]
  else:
    folder = _folder(root / "SICK", name, source)
    subsets = [_load_table(folder / _SICK_FILES[split], split, (5,), score=3, first=1, header=True)]
  return StsTask(name, split, {subset.name: subset for subset in subsets})


def load_sts_tasks(root: storage.PathLike, names: Sequence[str] = TASKS, source: str = "senteval") -> list[StsTask]:
  """The test split of each named task: with the default names, the seven tasks the papers average."""
  return [load_sts_task(root, name, "test", source) for name in names]


def _load_year(root: storage.Path, name: str, source: str) -> list[StsSubset]:
  """The subsets of STS12..STS16."""
  if source == "senteval":
    folder, prefix = f"STS/{name}-en-test", "STS"
  else:
    folder, prefix = _RAW_YEARS[name]
  folder = _folder(root / folder, name, source)
  columns = (4,) if source == "raw" and name == "STS16" else (2,)
  return [
    _load_pairs(folder / f"{prefix}.input.{subset}.txt", folder / f"{prefix}.gs.{subset}.txt", subset, columns)
    for subset in SUBSETS[name]
  ]


def _load_pairs(input_path: pathlib.Path, gold_path: pathlib.Path, name: str, columns: tuple[int, ...]) -> StsSubset:
  """A subset kept as an input file of pairs and a gold file aligned with it line by line."""
  pairs, gold = read_lines(input_path, "UTF-8"), read_lines(gold_path, "UTF-8")
  if len(pairs) != len(gold):
    raise DataError(
      f"{input_path} has {len(pairs)} lines but {gold_path} has {len(gold)}: the files differ "
      f"from line {min(len(pairs), len(gold)) + 1}"
    )
  rows = []
  for (lineno, line), (_, score) in zip(pairs, gold):
    fields = _fields(line, input_path, lineno, columns)
    if score.strip():  # A blank gold line marks a pair left out of the official scoring.
      rows.append((fields[0], fields[1], _score(score, gold_path, lineno)))
  return _subset(name, rows)


def _load_table(
  path: pathlib.Path, name: str, columns: tuple[int, ...], score: int, first: int, header: bool
) -> StsSubset:
  """A subset kept as one tab-separated table: the two sentences in columns `first` and `first + 1`."""
  rows = []
  for lineno, line in read_lines(path, "UTF-8")[int(header) :]:
    fields = _fields(line, path, lineno, columns)
    rows.append((fields[first], fields[first + 1], _score(fields[score], path, lineno)))
  if not rows:
    raise DataError(f"{path}: no sentence pairs after the header line")
  return _subset(name, rows)


def _subset(name: str, rows: list[tuple[str, str, float]]) -> StsSubset:
  return StsSubset(name, [row[0] for row in rows], [row[1] for row in rows], np.array([row[2] for row in rows]))


def _folder(path: storage.Path, name: str, source: str) -> pathlib.Path:
  """The local folder to read `path` from (a gs:// folder: its copy in the download cache, fetched once per host)."""
  local = storage.find_local(path)
  if local is None or not local.is_dir():
    raise DataError(f"{path}: no such directory (looked for {name} with source={source!r})")
  return local


def _fields(line: str, path: pathlib.Path, lineno: int, columns: tuple[int, ...]) -> list[str]:
  fields = line.split("\t")
  if len(fields) not in columns:
    expected = " or ".join(map(str, columns))
    raise DataError(f"{path}:{lineno}: expected {expected} tab-separated columns, found {len(fields)}")
  return fields


def _score(text: str, path: pathlib.Path, lineno: int) -> float:
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not math.isfinite(value):
    raise DataError(f"{path}:{lineno}: the score {text!r} is not a finite number")
  return value
