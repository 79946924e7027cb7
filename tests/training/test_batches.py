"""The training batches: a step's rows placed on the mesh, and their shapes known before they are placed."""

import jax

from jaxemb import sharding
from jaxemb.data import corpus
from jaxemb.models import load_tokenizer
from jaxemb.training import batches, loop, trainer
from tests.support import tiny_config


def test_shapes_are_those_of_the_placed_batch_at_every_width(tmp_path, tiny_bert, wiki_head):
  """Batches.shapes(step), what the step is compiled for ahead, equals place(step)'s shapes, dtypes and sharding,
  at each of the widths a run's batches are cut to."""
  config = tiny_config("promptbert", tiny_bert, tmp_path, wiki_head)
  config.data.length_multiple, config.data.max_sentence_tokens = 2, 64  # Rows shorter than the width.
  tokenizer = load_tokenizer(tiny_bert)
  objective = trainer.build_objective(config, tokenizer)
  fields = batches.tokenize_fields(config, loop.read_columns(config), objective, tokenizer, tmp_path / "cache",
                                   corpus.Hosts())
  plan = batches.Batches.build(config, fields, sharding.batch_sharding(sharding.make_mesh(-1, 1)))
  widths = set()
  for step in range(12):
    placed, shapes = plan.place(step), plan.shapes(step)
    assert jax.tree.structure(placed) == jax.tree.structure(shapes)
    for array, shape in zip(jax.tree.leaves(placed), jax.tree.leaves(shapes)):
      assert (array.shape, array.dtype, array.sharding) == (shape.shape, shape.dtype, shape.sharding)
    widths.add(next(iter(placed.values())).input_ids.shape[1])
  assert len(widths) > 1, widths  # The steps cover more than one width.
