"""One PromptBERT train step on a tiny model over a given mesh; writes the loss and params to an .npz.

Run in a subprocess, as `XLA_FLAGS=--xla_force_host_platform_device_count=N python -m tests.training.sharded_step
MODEL_DIR OUT.npz DATA FSDP`, because the simulated device count is fixed when JAX starts.
"""

import sys

import jax
import numpy as np

from jaxemb import sharding
from jaxemb.data import corpus
from jaxemb.models import checkpoint_files, load_pretrained, load_tokenizer
from jaxemb.training import loop, trainer
from jaxemb.spec import TrainingRun
from tests.support import tiny_config


def main(model_dir: str, out: str, data: int, fsdp: int):
  config = tiny_config("promptbert", model_dir, "/tmp/unused")
  config.train.batch_size = 8
  # Adam's first step moves every param by about +-lr whatever its gradient's size, so a gradient of ~1e-9 whose
  # sign flips with the reduction order would move a param by 2e-5; a larger eps keeps such float noise small.
  config.train.adam_eps = 1e-6
  tokenizer = load_tokenizer(model_dir)
  model_config, pretrained = load_pretrained(model_dir)
  mesh = sharding.make_mesh(data, fsdp)
  run = TrainingRun.from_config(config)
  built = trainer.build_trainer(run, model_config, pretrained, trainer.build_objective(run, tokenizer), mesh, 10)
  sentences = loop.read_columns(run)["text"][:8]
  batch_sharding = sharding.batch_sharding(mesh)
  batch = {
    trainer.batch_field("text", t.text): jax.tree.map(
      lambda x: jax.device_put(x, batch_sharding),
      corpus.tokenize_cached(sentences, t, tokenizer, 16, "/tmp/jaxemb-test-cache", tokenization="in_context"),
    )
    for t in built.objective.view_templates
  }
  initial = built.initial_state(pretrained)
  initial_digest = checkpoint_files.with_digest({}, initial)[checkpoint_files.DIGEST]["values"]
  state, metrics = built.step(initial, batch)
  leaves = jax.tree_util.tree_leaves_with_path(state.params)
  # The word table is over the size threshold, so fsdp splits it: as many distinct shards as the fsdp axis.
  words = state.params["encoder"]["embeddings"]["word"]["embedding"]
  np.savez(
    out,
    loss=np.asarray(metrics["loss"]),
    devices=len(jax.devices()),
    word_shards=len({str(shard.index) for shard in words.addressable_shards}),
    initial_digest=initial_digest,  # Computed where each shard of the state is: the same on every mesh.
    **{jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves},
  )
  try:
    sharding.check_batch_size(12, mesh)
  except ValueError as e:
    print(f"BATCH ERROR: {e}")


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
