"""What the STS scorer and the transfer tasks share: the `embed` and `preprocess` callables, one embedding call over
the distinct sentences of a set of tasks, and the boxed text table both print."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

Embed = Callable[[list[str]], np.ndarray]  # Sentences -> [len(sentences), dim] vectors.
Preprocess = Callable[[str], str]


def embed_distinct(embed: Embed, columns: Sequence[Sequence[str]],
                   preprocess: Preprocess | None) -> tuple[np.ndarray, list[np.ndarray]]:
  """Calls `embed` once with every distinct preprocessed sentence of `columns`, in first-seen order.

  Returns ([distinct, dim] vectors, each column's rows into them). `preprocess` None embeds the text as stored.
  """
  prepare = preprocess or (lambda sentence: sentence)
  index: dict[str, int] = {}  # Distinct text -> row of the embedding matrix.
  rows = [np.array([index.setdefault(prepare(s), len(index)) for s in column], dtype=np.int64) for column in columns]
  vectors = np.asarray(embed(list(index)))
  if vectors.ndim != 2 or len(vectors) != len(index):
    raise ValueError(f"embed returned shape {vectors.shape} for {len(index)} sentences; expected "
                     f"[{len(index)}, dim]")
  return vectors, rows


def boxed(header: list[str], rows: list[list[str]], left: int) -> str:
  """A text table with +---+ rules, like SimCSE's PrettyTable output; the first `left` columns (text) left-aligned,
  the numbers right-aligned."""
  widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
  rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
  line = lambda row: "| " + " | ".join(
      cell.ljust(w) if i < left else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))) + " |"
  return "\n".join([rule, line(header), rule, *map(line, rows), rule])
