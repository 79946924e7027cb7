"""The device mesh and the sharding rules: the batch over every device, params and optimizer state replicated
over `data` and, when large enough, split over `fsdp` (never along the scanned layers' stacking axis)."""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from jaxemb.errors import ConfigError
from jaxemb.models import bert

BATCH_AXES = ("data", "fsdp")  # The global batch is split over both axes.

# Leaves with fewer elements than this (1 MiB in float32) stay replicated over `fsdp`, as in big_vision's and
# MaxText's FSDP rules: splitting biases, LayerNorm scales, scalars or the rng key saves next to no memory and adds
# collectives to every step. BERT-base's kernels and word and position tables (each >= 512 x 768 = 393,216
# elements) and their Adam moments are above it; fsdp_spec's `min_size` lets tests split tiny models.
FSDP_MIN_SIZE = 2**18


def make_mesh(data: int, fsdp: int) -> Mesh:
  """A (data, fsdp) mesh over all devices of all processes; data = -1 takes what fsdp leaves."""
  count = jax.device_count()
  if fsdp < 1 or count % fsdp:
    raise ConfigError(f"mesh: fsdp={fsdp} does not divide the {count} devices")
  data = count // fsdp if data == -1 else data
  if data * fsdp != count:  # jax.make_mesh would silently take a subset of the devices.
    raise ConfigError(f"mesh: data={data} x fsdp={fsdp} != {count} devices")
  # jax.make_mesh orders the devices by the interconnect (TPU torus, GPU ids); Auto axes as before, so the jitted
  # step's in/out shardings place the arrays and the compiler propagates the rest (jax.make_mesh defaults to Explicit).
  return jax.make_mesh((data, fsdp), ("data", "fsdp"), axis_types=(AxisType.Auto, AxisType.Auto))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def fsdp_spec(shape: tuple[int, ...], fsdp: int, min_size: int = FSDP_MIN_SIZE) -> P:
  """P() for a leaf under `min_size` elements or with no dimension that `fsdp` divides; else the largest such
  dimension (the first of equals) split over `fsdp`."""
  if fsdp <= 1 or math.prod(shape) < min_size:
    return P()
  candidates = [d for d, n in enumerate(shape) if n >= fsdp and n % fsdp == 0]
  if not candidates:
    return P()
  spec = [None] * len(shape)
  spec[max(candidates, key=lambda d: shape[d])] = "fsdp"  # max keeps the first of equal sizes.
  return P(*spec)


def fsdp_sharding(mesh: Mesh, shape: tuple[int, ...], min_size: int = FSDP_MIN_SIZE) -> NamedSharding:
  """The leaf's sharding under the fsdp rule (fsdp_spec), replicated over `data`."""
  return NamedSharding(mesh, fsdp_spec(tuple(shape), mesh.shape["fsdp"], min_size))


def tree_shardings(mesh: Mesh, tree: Any, min_size: int = FSDP_MIN_SIZE) -> Any:
  """The sharding of every array of `tree` (concrete or abstract) under the fsdp rule; a leaf of the scanned
  layers (under `layers`, params or optimizer moments) keeps its leading layer axis whole, as maxtext's rules, since
  each scan step reads one layer's slice: its per-layer shape is split as the unscanned layer's would be."""

  def leaf_sharding(path, x):
    if jax.tree_util.DictKey(bert.STACKED) in path:
      per_layer = fsdp_spec(tuple(x.shape[1:]), mesh.shape["fsdp"], min_size)
      return NamedSharding(mesh, P(None, *per_layer) if per_layer else P())
    return fsdp_sharding(mesh, tuple(x.shape), min_size)

  return jax.tree_util.tree_map_with_path(leaf_sharding, tree)


def check_batch_size(global_batch_size: int, mesh: Mesh, name: str = "batch size"):
  """Raises ConfigError, naming the value as `name` (e.g. its config field), when the batch does not split evenly
  over the mesh's devices."""
  if global_batch_size % mesh.size:
    raise ConfigError(
      f"{name} {global_batch_size} is not divisible by the {mesh.size} devices of the mesh; use a "
      f"multiple of {mesh.size}"
    )
