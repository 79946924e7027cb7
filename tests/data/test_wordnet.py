"""WordNet's data files and word<TAB>definition files as word-definition pairs."""

import pathlib

import pytest

from jaxemb.data import wordnet
from jaxemb.errors import DataError

# Lines in the format of WordNet 3.0's data files: the license header, then one synset a line, each ending in two
# spaces as WordNet's do (the second written \x20, which the linter's trailing-whitespace check leaves alone).
_NOUNS = """\
  1 This software and database is being provided to you, the LICENSEE, by \x20
  2 Princeton University under the following license. \x20
07747607 13 n 01 orange 0 006 @ 07747055 n 0000 #p 12708293 n 0000 | round yellow to orange fruit of any of several \x20
03467517 06 n 02 guitar 0 Spanish_guitar 0 001 @ 03800933 n 0000 | a stringed instrument; played by strumming \x20
09411430 17 n 01 river 0 001 @ 09448361 n 0000 | a large natural stream of water (larger than a creek); "the river" \x20
"""
_ADJECTIVES = """\
00019731 00 s 02 ready_to_hand(p) 0 handy 0 001 & 00019131 a 0000 | easy to reach; "found a handy spot" \x20
"""


@pytest.fixture
def wordnet_dir(tmp_path):
  (tmp_path / "data.noun").write_text(_NOUNS)
  (tmp_path / "data.adj").write_text(_ADJECTIVES)
  return tmp_path


def test_reads_each_synsets_first_word_and_definition(wordnet_dir):
  pairs = wordnet.read_wordnet(wordnet_dir, ("noun", "adj"))
  assert [(p.word, p.definition) for p in pairs] == [
    ("orange", "round yellow to orange fruit of any of several"),
    ("guitar", "a stringed instrument; played by strumming"),  # One definition: its parts stay together.
    ("river", "a large natural stream of water (larger than a creek)"),  # The quoted example is left out.
    ("ready to hand", "easy to reach"),  # Underscores are spaces; the adjective marker (p) is dropped.
  ]
  assert wordnet.read_pairs(wordnet_dir) == pairs[:3]  # A directory is WordNet, nouns by default.


def test_malformed_inputs_are_named(wordnet_dir, tmp_path):
  (wordnet_dir / "data.verb").write_text("00001740 29 v 01 breathe 0 no gloss here\n")
  with pytest.raises(DataError, match=r"data.verb:1: not a WordNet data line"):
    wordnet.read_wordnet(wordnet_dir, ("verb",))
  with pytest.raises(DataError, match=r"data.adv"):
    wordnet.read_wordnet(wordnet_dir, ("adv",))  # Missing file.
  with pytest.raises(DataError, match="must be one of"):
    wordnet.read_wordnet(wordnet_dir, ("nouns",))
  with pytest.raises(DataError, match="wordnet-base"):
    wordnet.read_pairs(tmp_path / "absent")
  bad = tmp_path / "defs.tsv"
  bad.write_text("orange\ta fruit\n\nriver without a tab\n")
  with pytest.raises(DataError, match=r"defs.tsv:3: expected word<TAB>definition"):
    wordnet.read_pairs(bad)


def test_reads_a_definitions_file_and_samples_it(tmp_path):
  path = tmp_path / "defs.tsv"
  path.write_text("orange\ta large round juicy citrus fruit\n\napple\tfruit with red or yellow skin\nriver\tstream\n")
  pairs = wordnet.read_pairs(path)
  assert [p.word for p in pairs] == ["orange", "apple", "river"]
  drawn = wordnet.sample(pairs, 2, seed=0)
  assert len(set(drawn)) == 2 and set(drawn) <= set(pairs) and drawn == wordnet.sample(pairs, 2, seed=0)
  assert wordnet.sample(pairs, 0, seed=0) == pairs == wordnet.sample(pairs, 9, seed=0)


def test_reads_the_installed_wordnet():
  directory = pathlib.Path(wordnet.WORDNET_DIR)
  if not (directory / "data.noun").is_file():
    pytest.skip(f"{directory} has no WordNet data (Debian's wordnet-base is not installed)")
  pairs = wordnet.read_wordnet(directory, tuple(wordnet.DATA_FILES))
  assert len(pairs) == 117659  # WordNet 3.0's synsets: 82,115 nouns, 13,767 verbs, 18,156 adjectives, 3,621 adverbs.
  assert wordnet.WordDefinition("orange", "round yellow to orange fruit of any of several citrus trees") in pairs
  assert all(p.word and p.definition and '"' not in p.word for p in pairs)
