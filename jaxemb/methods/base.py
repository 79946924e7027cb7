"""What every sentence-embedding method owns, and the registry of the families that implement it.

A family is a frozen dataclass (hashable: methods are static jit arguments) registered with `register` under the
method names it implements. Its fields are its options, each with a default; it owns its checks, the encoder outputs
it reads, its vectors, their width, the weights and the state (e.g. fitted IDF weights) it needs, the state it fits on
sentences (`fit_source`/`fit`, e.g. whitening's transform), its sentence-transformers form, its model-card text and
its MTEB sentence rule. `Method(name, **fields)` builds the family registered under `name`, refusing in one line a
field that family does not take.

The flat `config.method` block of every config is the serialised form: each registered family's fields (`to_flat`)
side by side at their defaults; `from_config` hands the named family the fields set away from those defaults, so a
block (or an older run's eval_method.json) that names one method may carry every other family's fields untouched.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import io
import json
from typing import Any, Callable, ClassVar

import jax
import numpy as np

from jaxemb import atomic, storage, templates
from jaxemb.errors import ConfigError
from jaxemb.models import EncoderConfig, Transformer

_FAMILIES: dict[str, type[Method]] = {}  # Method name -> its family, in registration order.
# `fit_source`: the sentences of the evaluation at hand (Su et al.'s target-task setting; the papers' rows fit on NLI).
TASK_SENTENCES = "tasks"
FITTED_FILE = "fitted_state.npz"  # A method's fitted arrays, in a folder beside (or in) a run or an export.
METHOD_FILE = "jaxemb_method.json"  # An export's method (its config_fields): Encoder.from_pretrained(folder) reads it.
FITTED_FOR = "fitted_for"  # The fitted arrays' entry recording the method and model they were fitted for.


class NotExportable(ConfigError, NotImplementedError):
  """A method (or a run's continuous template) that the exported modules cannot compute."""


class FittedForAnother(ConfigError):
  """Fitted arrays whose record names another method or model (`check_fitted`)."""


def register(family: type[Method]) -> type[Method]:
  """Class decorator: registers `family` under each of its NAMES. A flat field that another family also declares
  must have the same default there (the block holds one value per field)."""
  clash = [name for name in family.NAMES if name in _FAMILIES]
  if clash:
    raise ValueError(f"methods {clash} are registered already")
  defaults = family.flat_defaults()
  for other in dict.fromkeys(_FAMILIES.values()):
    theirs = other.flat_defaults()
    shared = [key for key in defaults.keys() & theirs.keys() if defaults[key] != theirs[key]]
    if shared:
      raise ValueError(f"{family.__name__} and {other.__name__} give the fields {shared} different defaults")
  _FAMILIES.update(dict.fromkeys(family.NAMES, family))
  return family


def names() -> tuple[str, ...]:
  """Every registered method name."""
  return tuple(_FAMILIES)


def family(name: str) -> type[Method]:
  """The family registered under `name`; ConfigError naming every method when none is."""
  if name not in _FAMILIES:
    raise ConfigError(f"method {name!r} is not one of {names()}")
  return _FAMILIES[name]


def block_defaults() -> dict[str, Any]:
  """The flat `config.method` block but its name, at its defaults: every registered family's flat fields."""
  return {key: value for found in dict.fromkeys(_FAMILIES.values()) for key, value in found.flat_defaults().items()}


def exportable_names() -> tuple[str, ...]:
  """The methods with a sentence-transformers form."""
  return tuple(name for name in names() if Method(name).exportable)


def _current_value(field: str, value: Any, families: Any = None) -> Any:
  """`value` of `field` as `families` (default: every registered one) now write it (their RENAMED_VALUES)."""
  for found in dict.fromkeys(_FAMILIES.values()) if families is None else families:
    for old, new in found.RENAMED_VALUES.get(field, ()):
      if type(value) is type(old) and value == old:
        return new
  return value


def _takers(field: str) -> tuple[str, ...]:
  """The methods that take `field` (a dataclass or flat field)."""
  return tuple(
    name
    for name, found in _FAMILIES.items()
    if field in found.field_names() and name in found.FIELD_OWNERS.get(field, found.NAMES)
  )


def _arguments(found: type[Method]) -> list[str]:
  """The family's dataclass fields but its name: what `Method(name, ...)` takes in Python."""
  return sorted(f.name for f in dataclasses.fields(found) if f.name != "name")


def _misplaced(found: type[Method], name: str, field: str, value: Any) -> ConfigError:
  takers = _takers(field)
  got = f"got {field}={value!r}"
  if name in takers:  # A flat field the family builds an argument from (static's bias switches, a transform's source).
    return ConfigError(
      f"method {name!r} takes {field} in a config block, not as a Python argument (its arguments: "
      f"{', '.join(_arguments(found))}); {got}"
    )
  if takers:
    return ConfigError(f"method {name!r} takes no {field} (a field of {', '.join(takers)} only); {got}")
  # A name that starts another's first (`flowed`: `flowed_method` before the closer-scoring `flow_seed`).
  close = sorted(difflib.get_close_matches(field, _arguments(found), n=3), key=lambda arg: not arg.startswith(field))
  hint = f"; did you mean {' or '.join(close)}?" if close else ""
  return ConfigError(f"method {name!r} takes no {field} (no method's field{hint}); {got}")


@dataclasses.dataclass(frozen=True)
class Method:
  """How a sentence becomes a vector: the base of every family, and through `Method(name, **fields)` the registry's
  entry point, which builds the family registered under `name`.

  Attributes:
    name: the method, one of `names()`.
  """

  NAMES: ClassVar[tuple[str, ...]] = ()  # The method names the family implements.
  # field -> ((a value written before, its value now), ...) for a field whose values were renamed: older config
  # blocks, eval_method.json files and callers still load (prompt's denoise was a bool).
  RENAMED_VALUES: ClassVar[dict[str, tuple[tuple[Any, Any], ...]]] = {}
  # field -> the names among NAMES that take it, for a field only some of them read (default: all of NAMES).
  FIELD_OWNERS: ClassVar[dict[str, tuple[str, ...]]] = {}

  name: str

  def __new__(cls, *args: Any, **fields: Any) -> Method:
    if not args and "name" not in fields:  # copy and pickle make an empty instance and fill it.
      return super().__new__(cls)
    name = args[0] if args else fields["name"]
    found = cls if name in cls.NAMES else family(name)  # A family builds its own names before it is registered.
    if not issubclass(found, cls):
      raise ConfigError(f"method {name!r} is not one of {cls.NAMES}")
    known = {f.name for f in dataclasses.fields(found)}
    for field, value in fields.items():
      if field not in known:
        raise _misplaced(found, name, field, value)
    return super().__new__(found)

  def __post_init__(self):
    if self.name not in self.NAMES:
      raise ConfigError(f"method {self.name!r} is not one of {self.NAMES}")
    for field in dataclasses.fields(self):
      object.__setattr__(self, field.name, _current_value(field.name, getattr(self, field.name), [type(self)]))
      value = getattr(self, field.name)
      if self.name not in self.FIELD_OWNERS.get(field.name, self.NAMES) and value != field.default:
        raise _misplaced(type(self), self.name, field.name, value)

  # The serialised form.

  @classmethod
  def field_names(cls) -> set[str]:
    """The family's dataclass fields and flat fields."""
    return {f.name for f in dataclasses.fields(cls)} | cls.flat_defaults().keys()

  @classmethod
  def flat_defaults(cls) -> dict[str, Any]:
    """This family's flat fields at their defaults."""
    return cls(cls.NAMES[0]).to_flat()

  def to_flat(self) -> dict[str, Any]:
    """This method's own fields as flat config values (JSON's types), its name aside."""
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}

  @classmethod
  def from_flat(cls, name: str, fields: dict[str, Any]) -> Method:
    """The method `name` of this family from the flat fields set away from their defaults (the inverse of
    `to_flat`)."""
    return cls(name, **fields)

  def config_fields(self) -> dict[str, Any]:
    """This method as the flat `config.method` block: every registered family's fields, this method's own at their
    values and the others' at their defaults (`eval_common.method_config` builds every config's block from it)."""
    return {"name": self.name, **block_defaults(), **self.to_flat()}

  def changed_fields(self) -> dict[str, Any]:
    """The flat fields set away from their defaults: what sets this method apart from `Method(self.name)`."""
    defaults = block_defaults()
    return {key: value for key, value in self.to_flat().items() if value != defaults[key]}

  @staticmethod
  def from_config(block: Any) -> Method:
    """The method a `config.method` block (or a run's eval_method.json, older ones with only some fields) describes:
    its named family built from the fields set away from their defaults."""
    fields = {key: _current_value(key, value) for key, value in dict(block).items()}
    name = fields.pop("name")
    defaults = block_defaults()
    unknown = sorted(fields.keys() - defaults.keys())
    if unknown:
      raise ConfigError(f"config.method has no fields {unknown}; its fields: {sorted(defaults)}")
    return family(name).from_flat(name, {key: value for key, value in fields.items() if value != defaults[key]})

  # What the Encoder asks.

  @property
  def template(self) -> str:
    """The template the sentences are put in: "[X]", the sentence alone, but for the prompt methods."""
    return templates.SLOT

  def validate(self, config: EncoderConfig, num_masks: int):
    """Rejects a method that cannot run on this model, or on a template with `num_masks` [MASK]s, before anything is
    compiled or loaded."""
    del config, num_masks

  def required_weights(self) -> dict[str, str]:
    """{params group: what needs it} of the checkpoint weights beyond the encoder's that this method reads."""
    return {}

  def load_state(self, config: EncoderConfig, fitted: dict[str, np.ndarray] | None = None) -> Any:
    """The arrays this method reads besides the params (a pytree, e.g. weights read from a path field), loaded once
    on the host from `fitted` (`fit`'s arrays, or None before fitting) or elsewhere; the Encoder hands them to every
    `vectors` call. None: none."""
    del config, fitted
    return None

  # Fitted state: arrays a method learns from sentences before it encodes. The Encoder's `fit` runs `fit`,
  # evaluation/run.py calls it on `fit_source`'s sentences, `save_fitted` keeps the arrays in a file that
  # `Encoder.from_pretrained` and export read back; `load_state` turns them into what `vectors` reads.

  def fit_source(self) -> str | None:
    """What this method fits its state on: None (the default) when it fits nothing; TASK_SENTENCES for the
    sentences of the evaluation at hand; else a corpus file, one sentence a line."""
    return None

  def fitted_for(self) -> dict[str, Any]:
    """What this method's fitted arrays depend on, as flat fields with its name (`fitted_record`): by default all
    of them; a family leaves out those it applies when it loads the arrays (whitening's kept dimensions)."""
    return {"name": self.name, **self.to_flat()}

  def fit(self, embed: Callable[[Method, list[str]], np.ndarray], sentences: list[str]) -> dict[str, np.ndarray]:
    """This method's fitted arrays from `sentences`; `embed(method, sentences)` gives another method's vectors on
    the same model and settings. Called only for a method whose `fit_source` is not None."""
    raise NotImplementedError(f"{type(self).__name__} has a fit_source but no fit")

  def vectors_of_fit(self, state: Any, embedded: np.ndarray) -> np.ndarray | None:
    """This method's vectors of the sentences `fit` embedded, from the vectors its (last) `embed` call returned;
    `state` is `load_state`'s of the fitted arrays. None (the default): they are encoded again when asked for."""
    del state, embedded
    return None

  def rows(
    self,
    template: templates.Template,
    tokenizer: Any,
    sentences: list[str],
    max_sentence_tokens: int | None,
    max_length: int,
  ) -> templates.TemplateBatch:
    """The host-side rows of `sentences` for `vectors`."""
    raise NotImplementedError

  def forward_outputs(self) -> dict[str, Any]:
    """What the encoder's forward must return beyond the last hidden state: its output_hidden_states and
    output_attentions arguments."""
    return {}

  def encoder_outputs(self, model: Transformer, params: Any, batch: templates.TemplateBatch) -> Any:
    """One encoder pass over `batch` with just the outputs `forward_outputs` names."""
    return model.apply({"params": params}, batch.input_ids, batch.attention_mask, **self.forward_outputs())

  def vectors(
    self,
    model: Transformer,
    params: Any,
    batch: templates.TemplateBatch,
    *,
    state: Any = None,
    prompt: jax.Array | None = None,
    template: templates.Template | None = None,
  ) -> jax.Array:
    """[batch, *vector_shape] sentence vectors (traced: the Encoder jits it). `state` is `load_state`'s; `prompt`
    (with its `template`) an OptiPrompt continuous template that replaces the template's word embeddings."""
    raise NotImplementedError

  def width(self, config: EncoderConfig) -> int:
    """Width of this method's vectors."""
    return config.hidden_size

  def vector_shape(self, config: EncoderConfig) -> tuple[int, ...]:
    """The shape of one sentence's vector."""
    return (self.width(config),)

  # Export, model card, MTEB.

  @property
  def exportable(self) -> bool:
    """Whether `export` writes a sentence-transformers form of this method."""
    return False

  def check_exportable(self):
    """NotExportable, naming the exportable methods, for a method without a sentence-transformers form."""
    if not self.exportable:
      raise NotExportable(
        f"method {self.name!r} has no sentence-transformers form here; exportable methods: {exportable_names()}"
      )

  def export(
    self, out: Any, config: EncoderConfig, params: Any, tokenizer: Any, fitted: dict[str, np.ndarray] | None = None
  ):
    """Writes this method's sentence-transformers modules (modules.json and theirs) beside the Hugging Face
    checkpoint already in the folder `out` (a storage.Path), with `fit`'s arrays for a method that fits state;
    NotExportable for a method without them."""
    del out, config, params, tokenizer, fitted
    self.check_exportable()
    raise NotImplementedError(f"{type(self).__name__} says {self.name!r} is exportable but writes no modules")

  @property
  def remote_code(self) -> bool:
    """Whether the export is a custom module (loaded with trust_remote_code), which strips sentences as jaxemb does."""
    return False

  def card_tags(self) -> tuple[str, ...]:
    """The model card's Hub tags for this method."""
    return (self.name,)

  def card_text(self) -> str:
    """The model card's "## Method" section."""
    return f"## Method\n\n`{self.name}`.\n"

  @property
  def add_period(self) -> bool:
    """MTEB: whether sentences without final punctuation get "." (as jaxemb's STS evaluation of this method)."""
    return False


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tokenized(Method):
  """A method over the sentence's tokens in its template (`templates.tokenize_sentences`).

  Attributes:
    tokenization: how a sentence's tokens are found (templates.TOKENIZATIONS): "in_context" as the authors'
      evaluation.py, "alone" as their training rows and their trainer's STS-B dev scoring.
  """

  tokenization: str = "in_context"

  def __post_init__(self):
    super().__post_init__()
    if self.tokenization not in templates.TOKENIZATIONS:
      raise ConfigError(f"tokenization {self.tokenization!r} is not one of {templates.TOKENIZATIONS}")

  def rows(
    self,
    template: templates.Template,
    tokenizer: Any,
    sentences: list[str],
    max_sentence_tokens: int | None,
    max_length: int,
  ) -> templates.TemplateBatch:
    return templates.tokenize_sentences(
      template,
      tokenizer,
      sentences,
      max_sentence_tokens=max_sentence_tokens,
      max_length=max_length,
      tokenization=self.tokenization,
    )


def fitted_record(method: Method, config: EncoderConfig, params: Any) -> dict[str, np.ndarray]:
  """The entry a method's fitted arrays carry (FITTED_FOR, saved in their file): the method they were fitted for
  (`Method.fitted_for`) and the model, by a digest of its architecture and embedding tables (a trained run's differ
  from its base model's); `check_fitted` refuses them for another."""
  record = {"method": method.fitted_for(), "model": model_digest(config, params)}
  return {FITTED_FOR: np.array(json.dumps(record, sort_keys=True))}


def check_fitted(
  fitted: dict[str, np.ndarray], method: Method, config: EncoderConfig, params: Any
) -> dict[str, np.ndarray]:
  """`fitted` without its FITTED_FOR entry, after checking that entry against `method` and the model (`params`
  None: the method only); FittedForAnother naming what differs. Arrays saved before the entry existed pass
  unchecked."""
  arrays = {key: value for key, value in fitted.items() if key != FITTED_FOR}
  if FITTED_FOR not in fitted:
    return arrays
  record = json.loads(str(fitted[FITTED_FOR]))
  if record["method"] != method.fitted_for():
    theirs, ours = record["method"], method.fitted_for()
    differ = {key: theirs.get(key) for key in sorted(theirs.keys() | ours.keys()) if theirs.get(key) != ours.get(key)}
    raise FittedForAnother(
      f"the fitted state was fitted for method {theirs['name']!r} with {differ}, not for "
      f"this method {ours['name']!r}: fit it again (evaluate.py) for this method"
    )
  digest = None if params is None else model_digest(config, params)
  if digest is not None and record["model"] != digest:
    raise FittedForAnother(
      f"the fitted state was fitted on another model (digest {record['model'][:12]}, this "
      f"one's {digest[:12]}): fit it again (evaluate.py) on this model"
    )
  return arrays


def model_digest(config: EncoderConfig, params: Any) -> str:
  """A digest of the model: its architecture and its embedding tables (as float32)."""
  digest = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
  for table in sorted(params["embeddings"]):
    if "embedding" in params["embeddings"][table]:
      digest.update(np.asarray(jax.device_get(params["embeddings"][table]["embedding"]), np.float32).tobytes())
  return digest.hexdigest()


def save_fitted(path: storage.PathLike, fitted: dict[str, np.ndarray]):
  """Writes a method's fitted arrays to `path` (an .npz, local or gs://), whole or not at all."""
  atomic.write(path, lambda f: np.savez(f, **fitted))


def read_fitted(path: storage.PathLike) -> dict[str, np.ndarray]:
  """The fitted arrays `save_fitted` wrote to `path`; ConfigError when there is no such file."""
  path = storage.path(path)
  if not path.is_file():
    raise ConfigError(f"{path}: no such file (a method's fitted state, written by evaluate.py beside its output_json)")
  with np.load(io.BytesIO(path.read_bytes())) as arrays:
    return dict(arrays)
