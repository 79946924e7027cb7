"""One PromptBERT train step on a tiny model over a given mesh; writes the loss and params to an .npz.

Run in a subprocess, as `XLA_FLAGS=--xla_force_host_platform_device_count=N python -m tests.training.sharded_step
MODEL_DIR OUT.npz DATA FSDP`, because the simulated device count is fixed when JAX starts.
"""

import sys

import jax
import numpy as np

from jaxemb.data import corpus
from jaxemb.models import Transformer, load_pretrained, load_tokenizer
from jaxemb.training import loop, sharding
from jaxemb.training import state as train_state
from tests.training.test_loop import tiny_config


def main(model_dir: str, out: str, data: int, fsdp: int):
  config = tiny_config("promptbert", model_dir, "/tmp/unused")
  config.train.batch_size = 8
  # Adam's first step moves every param by about +-lr whatever its gradient's size, so a gradient of ~1e-9 whose
  # sign flips with the reduction order would move a param by 2e-5; a larger eps keeps such float noise small.
  config.train.adam_eps = 1e-6
  tokenizer = load_tokenizer(model_dir)
  model_config, pretrained = load_pretrained(model_dir)
  objective = loop.build_objective(config, tokenizer)
  sentences = loop.read_columns(config)["text"][:8]
  mesh = sharding.make_mesh(data, fsdp)
  batch_sharding = sharding.batch_sharding(mesh)
  batch = {loop._field("text", t.text): jax.tree.map(  # pylint: disable=protected-access
      lambda x: jax.device_put(x, batch_sharding),
      corpus.tokenize_cached(sentences, t, tokenizer, 16, "/tmp/jaxemb-test-cache", tokenization="in_context")) for t in objective.view_templates}
  tx = train_state.make_optimizer(config.train, 10)
  params, frozen = loop._initial_params(config, objective, pretrained, model_config.hidden_size)  # pylint: disable=protected-access
  abstract = jax.eval_shape(lambda p, f: train_state.init_state(p, f, tx, 0), params, frozen)
  shardings = sharding.tree_shardings(mesh, abstract)
  state = jax.jit(lambda p, f: train_state.init_state(p, f, tx, 0), out_shardings=shardings)(params, frozen)
  step = train_state.jit_train_step(objective, Transformer(model_config), tx, mesh, shardings)
  state, metrics = step(state, batch)
  leaves = jax.tree_util.tree_leaves_with_path(state.params)
  # The word table is over the size threshold, so fsdp splits it: as many distinct shards as the fsdp axis.
  words = state.params["encoder"]["embeddings"]["word"]["embedding"]
  np.savez(out, loss=np.asarray(metrics["loss"]), devices=len(jax.devices()),
           word_shards=len({str(shard.index) for shard in words.addressable_shards}),
           **{jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves})
  try:
    sharding.check_batch_size(12, mesh)
  except ValueError as e:
    print(f"BATCH ERROR: {e}")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
