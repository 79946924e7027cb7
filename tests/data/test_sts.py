"""Tests for jaxemb.data.sts: the real SentEval and raw SemEval files, the sentence rules, and bad input."""

import numpy as np
import pytest

from jaxemb.data import sts
from tests.support import shared_path

# SentEval's "all" setting: pairs with a gold score, per task (test splits).
SIZES = {
  "STS12": 3108,
  "STS13": 1500,
  "STS14": 3750,
  "STS15": 3000,
  "STS16": 1186,
  "STSBenchmark": 1379,
  "SICKRelatedness": 4927,
}


@pytest.fixture(scope="module")
def senteval_root():
  return shared_path("data", "senteval")


@pytest.fixture(scope="module")
def raw_root():
  return shared_path("data", "sts-raw")


def test_sizes_of_the_seven_tasks(senteval_root):
  tasks = sts.load_sts_tasks(senteval_root)
  assert {task.name: len(task) for task in tasks} == SIZES
  for task in tasks:
    assert tuple(task.subsets) == sts.SUBSETS.get(task.name, ("test",))
    for subset in task.subsets.values():
      assert subset.scores.dtype == np.float64
      assert np.all((subset.scores >= 0) & (subset.scores <= 5))


def test_unscored_pairs_are_dropped(senteval_root):
  # STS16's input files hold 9183 pairs, of which only 1186 have a gold score.
  subsets = sts.load_sts_task(senteval_root, "STS16").subsets
  assert {name: len(s) for name, s in subsets.items()} == {
    "answer-answer": 254,
    "headlines": 249,
    "plagiarism": 230,
    "postediting": 244,
    "question-question": 209,
  }


@pytest.mark.parametrize(
  "name, split, size",
  [
    ("STSBenchmark", "train", 5749),
    ("STSBenchmark", "dev", 1500),
    ("SICKRelatedness", "train", 4500),
    ("SICKRelatedness", "dev", 500),
  ],
)
def test_other_splits(senteval_root, name, split, size):
  task = sts.load_sts_task(senteval_root, name, split)
  assert (task.split, list(task.subsets), len(task)) == (split, [split], size)


def test_first_pairs_are_read_from_the_right_columns(senteval_root):
  stsb = sts.load_sts_task(senteval_root, "STSBenchmark").subsets["test"]
  assert (stsb.sentences1[0], stsb.sentences2[0], stsb.scores[0]) == (
    "a girl is styling her hair .",
    "a girl is brushing her hair .",
    2.5,
  )
  sick = sts.load_sts_task(senteval_root, "SICKRelatedness").subsets["test"]
  assert (sick.sentences1[0], sick.sentences2[0], sick.scores[0]) == (
    "There is no boy playing outdoors and there is no man smiling",
    "A group of kids is playing in a yard and an old man is standing in the background",
    3.3,
  )


@pytest.mark.parametrize("name", [*sts.STS_YEARS, "STSBenchmark"])
def test_raw_release_matches_senteval(senteval_root, raw_root, name):
  raw = sts.load_sts_task(raw_root, name, source="raw")
  processed = sts.load_sts_task(senteval_root, name)
  assert list(raw.subsets) == list(processed.subsets)
  # The same pairs, untokenised: equal once lowercased and stripped of spaces (but one STS12 MSRpar
  # sentence: SentEval's copy drops a stray control character).
  squash = lambda s: "".join(s.lower().split())
  for key, subset in raw.subsets.items():
    np.testing.assert_array_equal(subset.scores, processed.subsets[key].scores)
    pairs = zip(subset.sentences1, processed.subsets[key].sentences1)
    same = np.mean([squash(a) == squash(b) for a, b in pairs])
    assert same > 0.99
  # Cased (though the releases of STS14 deft-news and STS15 belief are lowercase already).
  assert any(s != s.lower() for subset in raw.subsets.values() for s in subset.sentences1)


def test_join_tokens():
  assert sts.join_tokens("a  man\tis\u00a0playing . ") == "a man is playing ."
  assert sts.join_tokens("  ") == ""


@pytest.mark.parametrize(
  "sentence, expected",
  [
    ("a man is playing", "a man is playing."),  # Directly after the last word: no space.
    ("a man is playing .", "a man is playing ."),
    ("is he playing ?", "is he playing ?"),
    ('he said " hi "', 'he said " hi "'),
    ("the dogs ' toys '", "the dogs ' toys '"),
    ("stop !", "stop !."),  # Only . ? " ' count as an ending.
    ("", ""),
  ],
)
def test_add_period(sentence, expected):
  assert sts.add_period(sentence) == expected


def test_unknown_task_split_or_source(tmp_path):
  with pytest.raises(ValueError, match="unknown STS task"):
    sts.load_sts_task(tmp_path, "STS17")
  with pytest.raises(ValueError, match="STS12 has no split 'dev'"):
    sts.load_sts_task(tmp_path, "STS12", "dev")
  with pytest.raises(ValueError, match="unknown source"):
    sts.load_sts_task(tmp_path, "STS12", source="moses")


# A small STS13 in SentEval's layout, valid until a test breaks one file.
GOOD_INPUT = "a b\tc d\ne f\tg h\ni j\tk l\n"
GOOD_GOLD = "1.0\n\n3.5\n"


def write_sts13(root):
  folder = root / "STS" / "STS13-en-test"
  folder.mkdir(parents=True)
  for subset in sts.SUBSETS["STS13"]:
    (folder / f"STS.input.{subset}.txt").write_text(GOOD_INPUT, encoding="utf-8")
    (folder / f"STS.gs.{subset}.txt").write_text(GOOD_GOLD, encoding="utf-8")
  return folder


def test_small_sts13(tmp_path):
  write_sts13(tmp_path)
  headlines = sts.load_sts_task(tmp_path, "STS13").subsets["headlines"]
  assert (headlines.sentences1, headlines.sentences2) == (["a b", "i j"], ["c d", "k l"])
  np.testing.assert_array_equal(headlines.scores, [1.0, 3.5])


@pytest.mark.parametrize(
  "file, content, message",
  [
    (
      "STS.input.OnWN.txt",
      "a b\tc d\ne f\ni j\tk l\n",
      r"STS\.input\.OnWN\.txt:2: expected 2 tab-separated columns, found 1",
    ),
    ("STS.input.OnWN.txt", "a b\tc d\ne f\tg h\tx\ni j\tk l\n", r"STS\.input\.OnWN\.txt:2: expected 2 .* found 3"),
    ("STS.gs.FNWN.txt", "1.0\n\nthree\n", r"STS\.gs\.FNWN\.txt:3: the score 'three' is not a finite number"),
    ("STS.gs.FNWN.txt", "1.0\nnan\n2\n", r"STS\.gs\.FNWN\.txt:2: the score 'nan'"),
    ("STS.gs.headlines.txt", "", r"STS\.gs\.headlines\.txt: empty file"),
    (
      "STS.gs.headlines.txt",
      "1.0\n\n",
      r"STS\.input\.headlines\.txt has 3 lines but .*STS\.gs\.headlines\.txt has 2: the files differ from line 3",
    ),
  ],
)
def test_bad_sts_files(tmp_path, file, content, message):
  (write_sts13(tmp_path) / file).write_text(content, encoding="utf-8")
  with pytest.raises(sts.DataError, match=message):
    sts.load_sts_task(tmp_path, "STS13")


def test_not_utf8(tmp_path):
  (write_sts13(tmp_path) / "STS.input.FNWN.txt").write_bytes(b"a b\tc d\ne \xff\tg h\ni j\tk l\n")
  with pytest.raises(sts.DataError, match=r"STS\.input\.FNWN\.txt:2: not UTF-8"):
    sts.load_sts_task(tmp_path, "STS13")


def test_missing_folder_or_file(tmp_path):
  with pytest.raises(sts.DataError, match=r"STS13-en-test: no such directory \(looked for STS13 with source="):
    sts.load_sts_task(tmp_path, "STS13")
  with pytest.raises(sts.DataError, match=r"test-gs: no such directory .*source='raw'"):
    sts.load_sts_task(tmp_path, "STS13", source="raw")
  (write_sts13(tmp_path) / "STS.gs.OnWN.txt").unlink()
  with pytest.raises(sts.DataError, match=r"STS13-en-test/STS\.gs\.OnWN\.txt: no such file"):
    sts.load_sts_task(tmp_path, "STS13")


def write_table(root, folder, file, text):
  (root / folder).mkdir(parents=True)
  (root / folder / file).write_text(text, encoding="utf-8")


STSB_ROW = "main-captions\tMSRvid\t2012test\t0001\t{score}\ta plane is taking off .\tan air plane is taking off ."
SICK_HEADER = "pair_ID\tsentence_A\tsentence_B\trelatedness_score\tentailment_judgment\r\n"


def test_stsb_and_sick_tables(tmp_path):
  write_table(
    tmp_path,
    "STS/STSBenchmark",
    "sts-dev.csv",
    STSB_ROW.format(score="5.000") + "\n" + STSB_ROW.format(score="1.5") + "\n",
  )
  write_table(tmp_path, "SICK", "SICK_trial.txt", SICK_HEADER + "1\tA b\tC d\t3.3\tNEUTRAL\r\n")
  stsb = sts.load_sts_task(tmp_path, "STSBenchmark", "dev").subsets["dev"]
  assert stsb.sentences2 == ["an air plane is taking off ."] * 2
  np.testing.assert_array_equal(stsb.scores, [5.0, 1.5])
  sick = sts.load_sts_task(tmp_path, "SICKRelatedness", "dev").subsets["dev"]
  assert (sick.sentences1, sick.sentences2, sick.scores.tolist()) == (["A b"], ["C d"], [3.3])


STSB_TEST = ("STSBenchmark", "STS/STSBenchmark", "sts-test.csv")
SICK_TEST = ("SICKRelatedness", "SICK", "SICK_test_annotated.txt")


@pytest.mark.parametrize(
  "name, folder, file, text, message",
  [
    (
      *STSB_TEST,
      STSB_ROW.format(score="2") + "\nmain\tMSRvid\t0\t1\t2\tx\n",
      r"sts-test\.csv:2: expected 7 tab-separated columns, found 6",
    ),
    (
      *STSB_TEST,
      STSB_ROW.format(score="2") + "\n" + STSB_ROW.format(score="?"),
      r"sts-test\.csv:2: the score '\?' is not a finite number",
    ),
    (*STSB_TEST, "", r"sts-test\.csv: empty file"),
    (*SICK_TEST, SICK_HEADER + "1\tA b\tC d\thigh\tNEUTRAL\n", r"SICK_test_annotated\.txt:2: the score 'high'"),
    (*SICK_TEST, SICK_HEADER + "1\tA b\tC d\n", r"SICK_test_annotated\.txt:2: expected 5 .* columns, found 3"),
    (*SICK_TEST, SICK_HEADER, r"SICK_test_annotated\.txt: no sentence pairs after the header line"),
  ],
)
def test_bad_tables(tmp_path, name, folder, file, text, message):
  write_table(tmp_path, folder, file, text)
  with pytest.raises(sts.DataError, match=message):
    sts.load_sts_task(tmp_path, name)


def test_raw_stsb_allows_licence_columns(tmp_path):
  row = STSB_ROW.format(score="4") + "\tsource A\tsource B"
  write_table(tmp_path, "STSBenchmark/stsbenchmark", "sts-test.csv", row + "\n")
  assert len(sts.load_sts_task(tmp_path, "STSBenchmark", source="raw")) == 1
  write_table(tmp_path, "STS/STSBenchmark", "sts-test.csv", row + "\n")
  with pytest.raises(sts.DataError, match="expected 7 tab-separated columns, found 9"):
    sts.load_sts_task(tmp_path, "STSBenchmark")


def test_subset_lengths_must_agree():
  with pytest.raises(ValueError, match="2 first sentences, 1 second sentences and 2 scores"):
    sts.StsSubset("x", ["a", "b"], ["c"], np.array([1.0, 2.0]))
