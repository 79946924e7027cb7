"""The training batches: a step's rows placed on the mesh, their shapes known before they are placed, and the next
ones prepared while a step runs."""

import threading
import time

import jax
import pytest

from jaxemb import sharding
from jaxemb.data import corpus
from jaxemb.models import load_tokenizer
from jaxemb.training import batches, loop, trainer
from jaxemb.spec import TrainingRun
from tests.support import tiny_config


def test_shapes_are_those_of_the_placed_batch_at_every_width(tmp_path, tiny_bert, wiki_head):
  """Batches.shapes(step), what the step is compiled for ahead, equals place(step)'s shapes, dtypes and sharding,
  at each of the widths a run's batches are cut to."""
  config = tiny_config("promptbert", tiny_bert, tmp_path, wiki_head)
  config.data.length_multiple, config.data.max_sentence_tokens = 2, 64  # Rows shorter than the width.
  tokenizer = load_tokenizer(tiny_bert)
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, tokenizer)
  fields = batches.tokenize_fields(
    run,
    loop.read_columns(run),
    objective,
    tokenizer,
    tmp_path / "cache",
    corpus.Hosts(),
  )
  plan = batches.Batches.build(run, fields, sharding.batch_sharding(sharding.make_mesh(-1, 1)))
  widths = set()
  for step in range(12):
    placed, shapes = plan.place(step), plan.shapes(step)
    assert jax.tree.structure(placed) == jax.tree.structure(shapes)
    for array, shape in zip(jax.tree.leaves(placed), jax.tree.leaves(shapes)):
      assert (array.shape, array.dtype, array.sharding) == (shape.shape, shape.dtype, shape.sharding)
    widths.add(next(iter(placed.values())).input_ids.shape[1])
  assert len(widths) > 1, widths  # The steps cover more than one width.


@pytest.mark.parametrize("name", ["promptbert", "cotbert", "promptbert_sup", "simcse"])
def test_a_steps_shapes_from_its_own_rows_are_those_of_the_whole_corpuss_fields(tmp_path, tiny_bert, name):
  """step_shapes(step), what the first step compiles for before the corpus is tokenised (loop.train), equals
  Batches.shapes(step) of tokenize_fields' rows: each field (PromptBERT's two templates, CoT-BERT's views, the
  supervised columns, SimCSE's one shared field) at the width of the step's longest row, in later epochs too."""
  config = tiny_config(name, tiny_bert, tmp_path)
  config.data.length_multiple, config.data.max_sentence_tokens = 2, 64  # Rows shorter than the width.
  tokenizer = load_tokenizer(tiny_bert)
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, tokenizer)
  columns = {column: values[:40] for column, values in loop.read_columns(run).items()}  # 10 steps an epoch.
  fields = batches.tokenize_fields(run, columns, objective, tokenizer, tmp_path / "cache", corpus.Hosts())
  batch_sharding = sharding.batch_sharding(sharding.make_mesh(-1, 1))
  plan = batches.Batches.build(run, fields, batch_sharding)
  widths = set()
  for step in [*range(10), 23]:
    shapes = batches.step_shapes(run, columns, objective, tokenizer, step, batch_sharding)
    assert jax.tree.structure(shapes) == jax.tree.structure(plan.shapes(step))
    assert jax.tree.leaves(shapes) == jax.tree.leaves(plan.shapes(step)), step
    widths.update(rows.input_ids.shape[1] for rows in shapes.values())
  assert len(fields) == {"promptbert": 2, "cotbert": 3, "promptbert_sup": 3, "simcse": 1}[name]
  assert len(widths) > 1, widths  # The steps cover more than one width.


def test_a_row_the_tokenizer_refuses_is_named_by_its_place_in_the_corpus(tmp_path, tiny_bert, wiki_head, monkeypatch):
  """A refused row in the first batch gives no shapes ahead (step_shapes None): the run's error is then
  tokenize_fields', naming the row by its index in the corpus, not in the batch."""
  run = TrainingRun.from_config(tiny_config("promptbert", tiny_bert, tmp_path, wiki_head))
  tokenizer = load_tokenizer(tiny_bert)
  objective = trainer.build_objective(run, tokenizer)
  columns = loop.read_columns(run)
  (sentences,) = columns.values()
  row = int(corpus.batch_indices(len(sentences), run.train.batch_size, run.train.seed, 0)[1])
  assert row != 1  # Its index in the batch (1) and in the corpus differ.
  tokenize_rows = corpus.tokenize_rows

  def refusing(rows, *args):
    if sentences[row] in rows:
      raise ValueError(f"Sentence {list(rows).index(sentences[row])} gives a row too long.")
    return tokenize_rows(rows, *args)

  monkeypatch.setattr(corpus, "tokenize_rows", refusing)
  batch_sharding = sharding.batch_sharding(sharding.make_mesh(-1, 1))
  assert batches.step_shapes(run, columns, objective, tokenizer, 0, batch_sharding) is None
  with pytest.raises(ValueError, match=rf"^sentences 0\.\. \(cache chunk 0\): Sentence {row} gives"):
    batches.tokenize_fields(run, columns, objective, tokenizer, tmp_path / "cache", corpus.Hosts())


@pytest.mark.parametrize("depth", [0, 2])
def test_prefetch_keeps_order_and_runs_ahead_a_bounded_number_of_items(depth):
  produced = []

  def items():
    for i in range(6):
      produced.append(i)
      yield i

  # depth 2: two items queued and one in the thread's hands, blocked; depth 0: nothing ahead.
  ahead = 1 if depth == 0 else depth + 2
  stream = batches.prefetch(items(), depth)
  assert next(stream) == 0
  deadline = time.time() + 5
  while len(produced) < ahead and time.time() < deadline:  # While item 0 is in use, the thread runs ahead.
    time.sleep(0.01)
  time.sleep(0.1)  # And no further.
  assert len(produced) == ahead
  assert list(stream) == [1, 2, 3, 4, 5]


def test_prefetch_raises_the_producers_error_in_order_and_stops_when_closed():
  def failing():
    yield 1
    raise KeyError("bad row")

  stream = batches.prefetch(failing(), 2)
  assert next(stream) == 1
  with pytest.raises(KeyError, match="bad row"):
    next(stream)
  endless = batches.prefetch(iter(int, 1), 2)  # Never ends on its own.
  assert next(endless) == 0
  endless.close()
  assert not any(t.name == "jaxemb-prefetch" for t in threading.enumerate())
