"""The training batches: each view's tokenised rows (the fields the trainer's step reads), a step's global batch
placed on the mesh, and the next ones prepared while a step runs (`prefetch`)."""

from __future__ import annotations

import dataclasses
import pathlib
import queue
import threading
from typing import Any, Callable, Generator, Iterator, TypeVar

import jax
import numpy as np

from jaxemb import templates
from jaxemb.data import corpus
from jaxemb.spec import TrainingRun
from jaxemb.training.objectives import Objective
from jaxemb.training.trainer import batch_field


def tokenize_fields(
  config: TrainingRun,
  columns: dict[str, list[str]],
  objective: Objective,
  tokenizer: Any,
  cache_dir: pathlib.Path,
  hosts: corpus.Hosts,
) -> dict[str, templates.TemplateBatch]:
  """Every row of each batch field (`batch_field`: a view's column in its template), tokenised once and cached;
  views with the same column and template share one field."""
  return _fields(
    config,
    objective,
    lambda column, template: corpus.tokenize_cached(
      columns[column],
      template,
      tokenizer,
      config.data.max_sentence_tokens,
      cache_dir,
      config.data.tokenization,
      hosts,
    ),
  )


def step_shapes(
  config: TrainingRun,
  columns: dict[str, list[str]],
  objective: Objective,
  tokenizer: Any,
  step: int,
  sharding: jax.sharding.Sharding,
) -> dict[str, templates.TemplateBatch] | None:
  """`Batches.shapes(step)` of the fields `tokenize_fields` gives, from the step's own global batch tokenised apart:
  known in a moment, where tokenising wiki1m takes a minute or more on a first run, so that the first step compiles
  meanwhile (loop.train). A batch whose rows the tokenizer refuses gives None: tokenize_fields then names the row
  by its place in the corpus."""
  everyone = corpus.batch_indices(len(next(iter(columns.values()))), config.train.batch_size, config.train.seed, step)
  tokenize = lambda column, template: corpus.tokenize_rows(
    [columns[column][i] for i in everyone],
    template,
    tokenizer,
    config.data.max_sentence_tokens,
    config.data.tokenization,
  )
  try:
    fields = _fields(config, objective, tokenize)
  except (TypeError, ValueError):
    return None
  return Batches.build(config, fields, sharding).shapes(0)  # One batch of these rows: the step's, reordered.


def _fields(
  config: TrainingRun, objective: Objective, tokenize: Callable[[str, templates.Template], templates.TemplateBatch]
) -> dict[str, templates.TemplateBatch]:
  """Each batch field's rows, `tokenize(column, template)`, once for views that share a column and template."""
  fields = {}
  for column, template in zip(config.objective.columns, objective.view_templates):
    name = batch_field(column, template.text)
    if name not in fields:
      fields[name] = tokenize(column, template)
  return fields


@dataclasses.dataclass(frozen=True)
class Batches:
  """The global batch of each step, drawn from `fields` (data.corpus's shuffle of `seed`) and placed by `sharding`."""

  fields: dict[str, templates.TemplateBatch]
  batch_size: int
  seed: int
  length_multiple: int  # Each batch's width: its longest row rounded up to a multiple of this (0: the full width).
  sharding: jax.sharding.Sharding
  row_lengths: dict[str, np.ndarray]  # Tokens attended in each field's rows.

  @classmethod
  def build(
    cls, config: TrainingRun, fields: dict[str, templates.TemplateBatch], sharding: jax.sharding.Sharding
  ) -> Batches:
    return cls(
      fields,
      config.train.batch_size,
      config.train.seed,
      config.data.length_multiple,
      sharding,
      {name: rows.attention_mask.sum(1) for name, rows in fields.items()},
    )

  @property
  def num_examples(self) -> int:
    return len(next(iter(self.row_lengths.values())))

  def place(self, step: int) -> dict[str, templates.TemplateBatch]:
    """The global batch of `step` on the mesh: this host's rows of each field, cut to the width of the field's
    longest row in the global batch (the same width on every host)."""
    index = corpus.batch_indices(
      self.num_examples, self.batch_size, self.seed, step, jax.process_index(), jax.process_count()
    )
    return jax.tree.map(lambda x: jax.make_array_from_process_local_data(self.sharding, x), self._rows(step, index))

  def shapes(self, step: int) -> dict[str, templates.TemplateBatch]:
    """The shapes, dtypes and sharding of `place(step)`'s arrays (jax.ShapeDtypeStructs): what the step of `step` is
    compiled for, known before the batch is placed."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self.sharding), self._rows(step))

  def _rows(self, step: int, index: np.ndarray | None = None) -> dict[str, templates.TemplateBatch]:
    """The rows `index` (None: the whole global batch) of each field, cut to the field's width in the global batch
    of `step`."""
    everyone = corpus.batch_indices(self.num_examples, self.batch_size, self.seed, step)
    index = everyone if index is None else index
    return {
      name: corpus.gather(
        rows, index, corpus.batch_width(self.row_lengths[name][everyone], self.length_multiple, rows.input_ids.shape[1])
      )
      for name, rows in self.fields.items()
    }


T = TypeVar("T")


def prefetch(items: Iterator[T], depth: int) -> Generator[T, None, None]:
  """`items` in order, produced by a background thread that stays up to `depth` items ahead (0: produced in the
  caller's thread when asked for). The training loop's items are placed batches: the next ones are gathered, cut
  and sent to the devices while the current step runs. An exception in `items` is raised here, at its place in
  the order; closing the generator stops the thread.
  """
  if depth == 0:
    yield from items
    return
  ready: queue.Queue = queue.Queue(maxsize=depth)
  stop = threading.Event()
  end = object()

  def put(item) -> bool:
    while not stop.is_set():
      try:
        ready.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def produce():
    try:
      for item in items:
        if not put((item, None)):
          return
      put((end, None))
    except Exception as e:  # pylint: disable=broad-except  # Re-raised in the consumer.
      put((end, e))

  thread = threading.Thread(target=produce, name="jaxemb-prefetch", daemon=True)
  thread.start()
  try:
    while True:
      item, error = ready.get()
      if error is not None:
        raise error
      if item is end:
        return
      yield item
  finally:
    stop.set()
    thread.join()
