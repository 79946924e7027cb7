"""The sharded train step on 8 simulated devices equal to the single-device step, and the fsdp rule over the train
state (the rule and the mesh themselves: tests/test_sharding.py)."""

import ast
import math
import re
import sys

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from jaxemb import sharding
from jaxemb.spec import TrainingRun
from tests.support import python_on_devices


def logged_steps():
  """tests.training.sharded_step once per mesh, each with the rule at a given threshold, printing `RUN OUT` and then
  each leaf the rule splits; argv: MODEL_DIR, then OUT DATA FSDP MIN_SIZE per run. One process for every run on the
  same device count: each pays its compile only, not a Python and JAX start."""
  from tests.training import sharded_step  # pylint: disable=import-outside-toplevel

  model_dir, runs = sys.argv[1], sys.argv[2:]
  rule = sharding.tree_shardings
  for out, data, fsdp, min_size in zip(*[iter(runs)] * 4):

    def logged(mesh, tree, min_size=int(min_size)):
      shardings = rule(mesh, tree, min_size)
      for path, s in jax.tree_util.tree_leaves_with_path(shardings):
        if s.spec != P():
          print(f"SPLIT {jax.tree_util.keystr(path)} {tuple(s.spec)!r}")
      return shardings

    print(f"RUN {out}")
    sharding.tree_shardings = logged  # sharded_step looks the rule up on the module at call time.
    sharded_step.main(model_dir, out, int(data), int(fsdp))


# The sharded runs the test compares: id -> (data, fsdp, min_size).
MESHES = {
  "data8": (8, 1, sharding.FSDP_MIN_SIZE),
  "data4xfsdp2": (4, 2, sharding.FSDP_MIN_SIZE),
  "data4xfsdp2-split-all": (4, 2, 1),
}


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory, tiny_bert):
  """id -> (params and loss after one step, its stdout, {leaf path: partition spec} of the leaves the rule split),
  for every run of MESHES, all in one subprocess on 8 simulated devices."""
  root = tmp_path_factory.mktemp("eight")
  runs = [(root / f"step-{name}.npz", *mesh) for name, mesh in MESHES.items()]
  stdout = python_on_devices(
    "from tests.training.test_sharding import logged_steps; logged_steps()",
    8,
    tiny_bert,
    *(field for run in runs for field in run),
  )
  outputs = dict(re.findall(r"^RUN (\S+)\n(.*?)(?=^RUN |\Z)", stdout, re.M | re.S))
  steps = {}
  for name, (out, *_) in zip(MESHES, runs):
    split = {path: ast.literal_eval(spec) for path, spec in re.findall(r"^SPLIT (\S+) (.+)$", outputs[str(out)], re.M)}
    steps[name] = dict(np.load(out)), outputs[str(out)], split
  return steps


@pytest.fixture(scope="module")
def single_device(tmp_path_factory, tiny_bert):
  """The same step on this process's one device (no subprocess needed)."""
  from tests.training import sharded_step  # pylint: disable=import-outside-toplevel

  out = tmp_path_factory.mktemp("one") / "step.npz"
  sharded_step.main(str(tiny_bert), str(out), 1, 1)
  return dict(np.load(out))


@pytest.mark.e2e
@pytest.mark.parametrize("name", MESHES)
def test_eight_devices_give_the_single_device_step(eight_devices, single_device, name):
  _, fsdp, min_size = MESHES[name]
  sharded, stdout, split = eight_devices[name]
  assert int(sharded["devices"]) == 8
  assert int(sharded["word_shards"]) == fsdp  # Params really are split over fsdp (and replicated over data).
  np.testing.assert_allclose(sharded["loss"], single_device["loss"], atol=1e-5)
  assert str(sharded["initial_digest"]) == str(single_device["initial_digest"])  # What a checkpoint's meta holds.
  for key, value in single_device.items():
    if key.startswith("["):
      np.testing.assert_allclose(sharded[key], value, atol=1e-5, err_msg=key)
  assert "BATCH ERROR: batch size 12 is not divisible by the 8 devices" in stdout
  # What the step really ran with: at the default threshold only the word table (param, Adam mu and nu) of the tiny
  # model is split; with no threshold its small kernels are too, so the step is checked with split matmuls.
  if fsdp == 1:
    assert not split
  elif min_size > 1:
    assert len(split) == 3 and all(p.endswith("['word']['embedding']") for p in split), split
    assert set(split.values()) == {("fsdp", None)}
  else:
    # The scanned layers' [3, in, out] kernels: each layer's [in, out] split, the layer axis whole.
    assert split[".params['encoder']['layers']['query']['kernel']"] == (None, "fsdp", None)
    assert split[".params['encoder']['layers']['ffn_in']['kernel']"] == (None, None, "fsdp")


@pytest.fixture(scope="module")
def abstract_state(tiny_bert):
  """The shapes and dtypes of the tiny PromptBERT train state, as the loop builds it."""
  from jaxemb.models import load_pretrained, load_tokenizer  # pylint: disable=import-outside-toplevel
  from jaxemb.training import trainer  # pylint: disable=import-outside-toplevel
  from tests.support import tiny_config  # pylint: disable=import-outside-toplevel

  config = tiny_config("promptbert", tiny_bert, "/tmp/unused")
  model_config, pretrained = load_pretrained(tiny_bert)
  run = TrainingRun.from_config(config)
  objective = trainer.build_objective(run, load_tokenizer(tiny_bert))
  return trainer.build_trainer(run, model_config, pretrained, objective, sharding.make_mesh(-1, 1), 10).abstract


@pytest.mark.parametrize("fsdp", [2, 8])
def test_train_state_small_leaves_and_the_rng_key_are_replicated(abstract_state, fsdp):
  shardings = sharding.tree_shardings(AbstractMesh((8 // fsdp, fsdp), ("data", "fsdp")), abstract_state)
  assert shardings.rng.spec == P() and shardings.step.spec == P()
  word = shardings.params["encoder"]["embeddings"]["word"]["embedding"]  # [30522, 32]
  assert word.spec == (P("fsdp", None) if fsdp == 2 else P(None, "fsdp"))
  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
    spec = sharding.fsdp_spec(leaf.shape, fsdp)
    if math.prod(leaf.shape) < sharding.FSDP_MIN_SIZE:
      assert spec == P(), jax.tree_util.keystr(path)
    else:
      assert list(spec).count("fsdp") == 1, jax.tree_util.keystr(path)
  # With a small threshold each layer's [32, 64] kernel splits on its larger axis; the stacking axis stays whole.
  kernel = abstract_state.params["encoder"]["layers"]["ffn_in"]["kernel"]
  assert kernel.shape == (3, 32, 64) and sharding.fsdp_spec(kernel.shape[1:], fsdp, 1024) == P(None, "fsdp")
  small = sharding.tree_shardings(AbstractMesh((8 // fsdp, fsdp), ("data", "fsdp")), abstract_state, 1024)
  assert small.params["encoder"]["layers"]["ffn_in"]["kernel"].spec == P(None, None, "fsdp")
