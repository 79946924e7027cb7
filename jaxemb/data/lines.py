"""The numbered lines of a dataset file, as the STS and transfer readers take them."""

from __future__ import annotations

import pathlib

from jaxemb.errors import DataError


def read_lines(path: pathlib.Path, encoding: str) -> list[tuple[int, str]]:
  """The (1-based number, text) of each line; DataError when the file is missing, empty or not `encoding` (the
  message names the encoding as given)."""
  if not path.is_file():
    raise DataError(f"{path}: no such file")
  data = path.read_bytes()
  try:
    text = data.decode(encoding)
  except UnicodeDecodeError as e:
    lineno = data[:e.start].count(b"\n") + 1
    raise DataError(f"{path}:{lineno}: not {encoding} ({e.reason})") from e
  # Line ends as Python's text mode reads them, as SentEval's readers do (SICK's test file has CRLF ends). Not
  # str.splitlines(): it would also break lines at U+0085, U+2028 or a form feed inside a sentence.
  lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
  if lines[-1] == "":
    lines.pop()
  if not lines:
    raise DataError(f"{path}: empty file")
  return list(enumerate(lines, start=1))
