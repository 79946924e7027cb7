"""Words and their dictionary definitions, the inputs of PromptBERT's T5 template generation (§4.2): WordNet's
data files as Debian's `wordnet-base` installs them (read directly, no nltk), or any `word<TAB>definition` file.
"""

from __future__ import annotations

import dataclasses
import pathlib
import random
import re

from jaxemb.data import lines
from jaxemb.errors import DataError

# Debian's wordnet-base: `apt-get install wordnet-base`.
WORDNET_DIR = "/usr/share/wordnet"
# Part of speech -> WordNet data file (wndb(5WN)).
DATA_FILES = {"noun": "data.noun", "verb": "data.verb", "adj": "data.adj", "adv": "data.adv"}
# An adjective's syntactic marker after the word: (a) prenominal, (p) predicate, (ip) immediately postnominal.
_ADJECTIVE_MARKER = re.compile(r"\((a|p|ip)\)$")


@dataclasses.dataclass(frozen=True)
class WordDefinition:
  """A word and one definition of it (`orange`: `round yellow to orange fruit of any of several citrus trees`)."""

  word: str
  definition: str


def read_wordnet(directory: str | pathlib.Path, parts_of_speech: tuple[str, ...] = ("noun",)) -> list[WordDefinition]:
  """Each synset's first word and its definition (the gloss before its quoted examples), in file order.

  Lines of a data file (wndb(5WN)): `offset lex_filenum ss_type w_cnt word lex_id [word lex_id ...] p_cnt
  [pointers] [frames] | gloss`, w_cnt in hex; the license header's lines start with two spaces. Underscores in a
  word are spaces. Raises DataError naming the file (and line) when one is missing or malformed.
  """
  unknown = sorted(set(parts_of_speech) - set(DATA_FILES))
  if unknown or not parts_of_speech:
    raise DataError(f"WordNet parts of speech {list(parts_of_speech)}: each must be one of {sorted(DATA_FILES)}")
  directory = pathlib.Path(directory)
  if not directory.is_dir():
    raise DataError(
      f"{directory}: no WordNet directory (install Debian's wordnet-base: `apt-get install "
      f"wordnet-base`, or pass a word<TAB>definition file)"
    )
  pairs = []
  for pos in parts_of_speech:
    path = directory / DATA_FILES[pos]
    pairs += [
      _synset(path, lineno, line) for lineno, line in lines.read_lines(path, "utf-8") if not line.startswith("  ")
    ]
  return pairs


def _synset(path: pathlib.Path, lineno: int, line: str) -> WordDefinition:
  fields, bar, gloss = line.partition(" | ")
  fields = fields.split()
  if not bar or len(fields) < 6 or not re.fullmatch(r"[0-9a-f]{2}", fields[3]):
    raise DataError(
      f"{path}:{lineno}: not a WordNet data line (offset lex_filenum ss_type w_cnt word lex_id ... "
      f"| gloss): {line[:80]!r}"
    )
  word = _ADJECTIVE_MARKER.sub("", fields[4]).replace("_", " ")
  definition = gloss.split('; "')[0].strip().strip(";").strip()
  return WordDefinition(word, definition)


def read_definitions_file(path: str | pathlib.Path) -> list[WordDefinition]:
  """The pairs of a UTF-8 `word<TAB>definition` file, one a line; blank lines are skipped."""
  path = pathlib.Path(path)
  pairs = []
  for lineno, line in lines.read_lines(path, "utf-8"):
    if not line.strip():
      continue
    word, tab, definition = line.partition("\t")
    if not tab or not word.strip() or not definition.strip():
      raise DataError(f"{path}:{lineno}: expected word<TAB>definition, got {line[:80]!r}")
    pairs.append(WordDefinition(word.strip(), definition.strip()))
  return pairs


def read_pairs(source: str | pathlib.Path, parts_of_speech: tuple[str, ...] = ("noun",)) -> list[WordDefinition]:
  """WordNet's pairs when `source` is a directory, else a `word<TAB>definition` file's."""
  if not pathlib.Path(source).exists():
    raise DataError(
      f"{source}: no such file or directory; give a WordNet directory ({WORDNET_DIR} once Debian's "
      "wordnet-base is installed) or a word<TAB>definition file"
    )
  return read_wordnet(source, parts_of_speech) if pathlib.Path(source).is_dir() else read_definitions_file(source)


def sample(pairs: list[WordDefinition], count: int, seed: int) -> list[WordDefinition]:
  """`count` pairs drawn without replacement (seeded, in the order drawn); all of them when count is 0 or more
  than there are."""
  if count <= 0 or count >= len(pairs):
    return list(pairs)
  return random.Random(seed).sample(pairs, count)
