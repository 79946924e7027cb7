"""The fsdp sharding rule and the mesh (8 simulated devices in a subprocess)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, PartitionSpec as P

from jaxemb import sharding
from tests.support import python_on_devices


@pytest.mark.parametrize(
  "shape, fsdp, min_size, expected",
  [
    ((30522, 32), 2, sharding.FSDP_MIN_SIZE, P("fsdp", None)),  # The largest axis.
    ((30522, 32), 8, sharding.FSDP_MIN_SIZE, P(None, "fsdp")),  # 8 does not divide 30522: the next axis.
    ((32, 64), 2, 1024, P(None, "fsdp")),
    ((32, 64), 2, sharding.FSDP_MIN_SIZE, P()),  # Under the threshold.
    ((64, 64), 2, 1, P("fsdp", None)),  # Equal axes: the first.
    ((3, 30521, 33), 2, 1, P()),  # No axis that fsdp divides.
    ((1, 2**20), 2, sharding.FSDP_MIN_SIZE, P(None, "fsdp")),  # A size-1 axis is never split.
    ((2**20,), 1, 1, P()),  # No fsdp axis to split over.
    ((), 2, 0, P()),  # Scalars.
    ((2,), 2, sharding.FSDP_MIN_SIZE, P()),  # The rng key data.
    ((768,), 2, sharding.FSDP_MIN_SIZE, P()),  # A bias or LayerNorm scale.
  ],
)
def test_rule_splits_only_large_leaves_on_their_largest_divisible_axis(shape, fsdp, min_size, expected):
  assert sharding.fsdp_spec(shape, fsdp, min_size) == expected
  mesh = AbstractMesh((8 // fsdp, fsdp), ("data", "fsdp"))
  assert sharding.fsdp_sharding(mesh, shape, min_size).spec == expected


def test_scanned_layers_are_never_split_along_the_layer_axis():
  """A stacked leaf splits as each of its layers would, even where the layer axis is the largest."""
  mesh = AbstractMesh((1, 2), ("data", "fsdp"))
  leaf = jax.ShapeDtypeStruct((64, 32, 16), jnp.float32)
  shardings = sharding.tree_shardings(mesh, {"layers": {"kernel": leaf}, "other": leaf}, min_size=1)
  assert shardings["layers"]["kernel"].spec == P(None, "fsdp", None)
  assert shardings["other"].spec == P("fsdp", None, None)


def mesh_facts():
  """JSON on stdout: what make_mesh builds for a few (data, fsdp) requests, its errors, and where the rule places
  a large and a small array."""
  facts = {}
  for data, fsdp in [(8, 1), (4, 2), (-1, 2), (-1, 8), (2, 4), (-1, 3), (2, 2), (4, 0)]:
    try:
      mesh = sharding.make_mesh(data, fsdp)
    except ValueError as e:
      facts[f"{data}x{fsdp}"] = f"ValueError: {e}"
      continue
    facts[f"{data}x{fsdp}"] = {
      "shape": dict(mesh.shape),
      "types": [t.name for t in mesh.axis_types],
      "ids": sorted(d.id for d in mesh.devices.flat),
    }
  mesh = sharding.make_mesh(4, 2)
  for name, shape in [("large", (30522, 32)), ("small", (32, 64))]:
    x = jax.device_put(np.zeros(shape, np.float32), sharding.fsdp_sharding(mesh, shape))
    facts[name] = {"shard": list(x.addressable_shards[0].data.shape), "devices": len(x.sharding.device_set)}
  print(json.dumps(facts))


def test_make_mesh_gives_the_requested_shape_on_eight_devices():
  facts = json.loads(python_on_devices("from tests.test_sharding import mesh_facts; mesh_facts()", 8))
  for key, shape in {"8x1": (8, 1), "4x2": (4, 2), "-1x2": (4, 2), "-1x8": (1, 8), "2x4": (2, 4)}.items():
    assert facts[key]["shape"] == {"data": shape[0], "fsdp": shape[1]}, key
    assert facts[key]["types"] == ["Auto", "Auto"], key  # As before: the jitted step's shardings are explicit.
    assert facts[key]["ids"] == list(range(8)), key  # Every device, once.
  assert facts["-1x3"] == "ValueError: mesh: fsdp=3 does not divide the 8 devices"
  assert facts["2x2"] == "ValueError: mesh: data=2 x fsdp=2 != 8 devices"  # Not a silent subset of the devices.
  assert facts["4x0"].startswith("ValueError")
  assert facts["large"] == {"shard": [15261, 32], "devices": 8}
  assert facts["small"] == {"shard": [32, 64], "devices": 8}
