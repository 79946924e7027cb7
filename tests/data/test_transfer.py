"""Tests for jaxemb.data.transfer: SentEval's transfer files (sizes, labels, columns) and bad input."""

import collections

import pytest

from jaxemb.data import transfer
from jaxemb.data.sts import DataError
from tests.support import shared_path

# SentEval's counts (binary tasks: blank lines included, as SentEval keeps them).
SIZES = {
  "MR": {"all": 10662},
  "CR": {"all": 3775},
  "SUBJ": {"all": 10000},
  "MPQA": {"all": 10606},
  "SST2": {"train": 67349, "dev": 872, "test": 1821},
  "TREC": {"train": 5452, "test": 500},
  "MRPC": {"train": 4076, "test": 1725},
}
POSITIVES = {"MR": 5331, "CR": 2407, "SUBJ": 5000, "MPQA": 3312}  # Label 1: the first file.


@pytest.fixture(scope="module")
def tasks():
  return {task.name: task for task in transfer.load_transfer_tasks(shared_path("data", "senteval"))}


def test_sizes_and_label_sets(tasks):
  assert list(tasks) == list(transfer.TASKS)
  for name, task in tasks.items():
    assert {split: len(s) for split, s in task.splits.items()} == SIZES[name]
    for s in task.splits.values():
      assert set(s.labels.tolist()) == set(range(task.num_classes))
      assert len(s.columns) == (2 if name == "MRPC" else 1)


def test_binary_tasks_label_the_first_file_1_and_keep_blank_lines(tasks):
  for name, positives in POSITIVES.items():
    split = tasks[name].splits["all"]
    assert split.labels[:positives].all() and not split.labels[positives:].any()
  assert tasks["SUBJ"].classes == ("subjective", "objective")
  assert sum(not s.strip() for s in tasks["CR"].splits["all"].columns[0]) == 4
  assert sum(not s.strip() for s in tasks["MPQA"].splits["all"].columns[0]) == 3


def test_trec_keeps_the_six_coarse_labels(tasks):
  trec = tasks["TREC"]
  assert trec.classes == ("ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM")
  counts = collections.Counter(trec.classes[label] for label in trec.splits["test"].labels)
  assert counts == {"DESC": 138, "NUM": 113, "ENTY": 94, "LOC": 81, "HUM": 65, "ABBR": 9}
  train = trec.splits["train"]
  assert (train.columns[0][0], trec.classes[train.labels[0]]) == (
    "How did serfdom develop in and then leave Russia ?",
    "DESC",
  )
  assert train.columns[0][65] == "Which city has the oldest relationship as a sister\u00f0city with Los Angeles ?"


def test_mrpc_pairs_and_sst_rows(tasks):
  mrpc = tasks["MRPC"].splits["test"]
  assert mrpc.columns[0][0].startswith("PCCW 's chief operating officer")
  assert mrpc.columns[1][0].startswith("Current Chief Operating Officer Mike Butcher")
  assert mrpc.labels.sum() == 1147 and tasks["MRPC"].splits["train"].labels.sum() == 2753
  sst = tasks["SST2"].splits["dev"]
  assert (sst.columns[0][0], sst.labels[0]) == ("it 's a charming and often affecting journey . ", 1)


# A minimal valid folder per task, to break one file at a time.
_VALID = {
  "MR": {"rt-polarity.pos": "good .\n", "rt-polarity.neg": "bad .\n"},
  "SST2": {name: "fine .\t1\nawful .\t0\n" for name in ("sentiment-train", "sentiment-dev", "sentiment-test")},
  "TREC": {"train_5500.label": "NUM:dist How far ?\nHUM:ind Who ?\n", "TREC_10.label": "LOC:city Where ?\n"},
  "MRPC": {
    name: "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\ta .\tan a .\n0\t3\t4\tb .\tc .\n"
    for name in ("msr_paraphrase_train.txt", "msr_paraphrase_test.txt")
  },
}


def _write(root, name, **files):
  folder = root / ("SST/binary" if name == "SST2" else name)
  folder.mkdir(parents=True)
  for file, text in {**_VALID[name], **files}.items():
    (folder / file).write_bytes(text if isinstance(text, bytes) else text.encode())
  return folder


def test_valid_minimal_layout_reads(tmp_path):
  for name in _VALID:
    _write(tmp_path, name)
  loaded = transfer.load_transfer_tasks(tmp_path, list(_VALID))
  assert [len(task.splits) for task in loaded] == [1, 3, 2, 2]
  assert loaded[2].splits["train"].columns[0] == ["How far ?", "Who ?"]


@pytest.mark.parametrize(
  "name, file, text, message",
  [
    ("TREC", "train_5500.label", "NUM:dist How far ?\nWHAT:x Why ?\n", r"train_5500.label:2: expected 'COARSE:fine"),
    ("TREC", "TREC_10.label", "NUM:dist\n", r"TREC_10.label:1: expected 'COARSE:fine"),
    ("SST2", "sentiment-dev", "fine .\t1\nawful .\t0\textra\n", r"sentiment-dev:2: expected 2 tab-separated columns"),
    ("SST2", "sentiment-test", "fine .\t1\nawful .\t2\n", r"sentiment-test:2: the label '2' is not 0 or 1"),
    ("SST2", "sentiment-train", b"fine .\t1\n\xff .\t0\n", r"sentiment-train:2: not utf-8"),
    ("MRPC", "msr_paraphrase_test.txt", "header\n1\t1\t2\ta .\n", r"msr_paraphrase_test.txt:2: expected 5 tab-sep"),
    (
      "MRPC",
      "msr_paraphrase_train.txt",
      "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n",
      r"msr_paraphrase_train.txt: no examples after the header line",
    ),
    ("MR", "rt-polarity.neg", "", r"rt-polarity.neg: empty file"),
    ("TREC", "TREC_10.label", "", r"TREC_10.label: empty file"),
  ],
)
def test_malformed_files_name_the_file_and_line(tmp_path, name, file, text, message):
  _write(tmp_path, name, **{file: text})
  with pytest.raises(DataError, match=message):
    transfer.load_transfer_task(tmp_path, name)


def test_missing_folder_and_file_are_named(tmp_path):
  with pytest.raises(DataError, match=r"CR: no such directory \(looked for CR"):
    transfer.load_transfer_task(tmp_path, "CR")
  folder = _write(tmp_path, "MR")
  (folder / "rt-polarity.pos").unlink()
  with pytest.raises(DataError, match=r"rt-polarity.pos: no such file"):
    transfer.load_transfer_task(tmp_path, "MR")


def test_unknown_task_is_rejected(tmp_path):
  with pytest.raises(ValueError, match=r"unknown transfer task 'SST5'"):
    transfer.load_transfer_task(tmp_path, "SST5")
