"""The run directory (what train.py writes): its layout, read and written through `RunDir` alone, and the
model sources that encoding and export load (a Hugging Face checkpoint or a run directory's best step).

    <workdir>/model/         the encoder's config.json and tokenizer (Hugging Face format), written at start,
                             and eval_method.json: how the run embeds a sentence at evaluation
    <workdir>/checkpoints/N  the full train state every `save_every` steps (resume restarts from the latest)
    <workdir>/best/N         the params of the best STS-B dev step: {"encoder", "mlp"?, "prompt"?}
    <workdir>/metrics.jsonl  the logged scalars, one JSON object a line; tensorboard/ holds the same as events
    <workdir>/cache/         the tokenised training rows, unless data.cache_dir names another place
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxemb.models import bert, hf
from jaxemb.models.config import EncoderConfig


class RunDir:
  """The paths of a run directory (absolute, as Orbax wants them)."""

  def __init__(self, path: str | pathlib.Path):
    self.path = pathlib.Path(path).absolute()
    self.model_dir = self.path / "model"
    self.config_file = self.model_dir / "config.json"
    self.eval_method_file = self.model_dir / "eval_method.json"
    self.checkpoints_dir = self.path / "checkpoints"
    self.best_dir = self.path / "best"
    self.metrics_file = self.path / "metrics.jsonl"
    self.tensorboard_dir = self.path / "tensorboard"
    self.cache_dir = self.path / "cache"


def is_run_dir(path: str | pathlib.Path) -> bool:
  """Whether `path` is a run directory with a best step to read: model/config.json and best/."""
  run = RunDir(path)
  return run.config_file.is_file() and run.best_dir.is_dir()


def load_best(workdir: str | pathlib.Path) -> tuple[EncoderConfig, dict[str, Any], dict[str, Any]]:
  """(encoder config, params tree of the best step {"encoder", ...}, its meta) of a run directory; the encoder per
  layer (`layer_{i}/...`) as a Hugging Face checkpoint reads, whether or not the run scanned its layers."""
  run = RunDir(workdir)
  if not is_run_dir(run.path):
    raise FileNotFoundError(f"{run.path} is not a jaxemb run directory (needs model/config.json and best/)")
  manager = ocp.CheckpointManager(run.best_dir)
  step = manager.latest_step()
  if step is None:
    raise FileNotFoundError(f"{run.best_dir} holds no checkpoint yet")
  target = abstract_on_one_device(run.best_dir / str(step) / "params")
  restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target),
                                                           meta=ocp.args.JsonRestore()))
  manager.close()
  params = {**restored["params"], "encoder": bert.unstack_layers(restored["params"]["encoder"])}
  return hf.read_config(run.model_dir), params, restored["meta"]


def save_eval_method(workdir: str | pathlib.Path, fields: dict[str, Any]):
  """Records the run's evaluation method (`jaxemb.encode.Method` fields) in <workdir>/model/eval_method.json."""
  RunDir(workdir).eval_method_file.write_text(json.dumps(fields, indent=2) + "\n")


def load_eval_method(workdir: str | pathlib.Path) -> dict[str, Any]:
  """The `jaxemb.encode.Method` fields the run was evaluated with during training."""
  path = RunDir(workdir).eval_method_file
  if not path.is_file():
    raise FileNotFoundError(f"{path} is missing (a run from an older jaxemb?): pass the method explicitly")
  return json.loads(path.read_text())


def abstract_on_one_device(item_dir: pathlib.Path) -> Any:
  """The saved tree's shapes and dtypes placed on this process's first device: a checkpoint written on any mesh
  (8 devices, several hosts) restores in one process."""
  metadata = ocp.StandardCheckpointer().metadata(item_dir).item_metadata
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)


@dataclasses.dataclass(frozen=True)
class ModelSource:
  """A model to encode with or export: a Hugging Face checkpoint (local directory or hub id) or a run directory's
  best step. Its config and tokenizer are read when it is opened, so a method can be checked against them before
  `load_params` reads the weights."""

  run: RunDir | None  # None for a Hugging Face checkpoint.
  model_dir: pathlib.Path  # config.json and the tokenizer: the checkpoint's directory, or the run's model/.
  config: EncoderConfig
  tokenizer: Any

  def load_params(self) -> dict[str, Any]:
    """{"encoder"} of a checkpoint; the best step's tree of a run ({"encoder", "mlp"?, "prompt"?})."""
    if self.run is None:
      return {"encoder": hf.load_pretrained(self.model_dir)[1]}
    return load_best(self.run.path)[1]


def open_source(name_or_path: str | pathlib.Path) -> ModelSource:
  """The run directory or Hugging Face checkpoint `name_or_path` names, its config and tokenizer read."""
  run = RunDir(name_or_path) if is_run_dir(name_or_path) else None
  model_dir = hf.resolve_model_dir(name_or_path) if run is None else run.model_dir
  return ModelSource(run, model_dir, hf.read_config(model_dir), hf.load_tokenizer(model_dir))
