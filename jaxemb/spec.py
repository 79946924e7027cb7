"""The typed run spec: what a training run is, as frozen dataclasses built once from its ml_collections config.

A config file stays the user's form (configs/*.py, `--config.train.batch_size=8` on the command line); the command
turns it into a `TrainingRun` (`TrainingRun.from_config`) and the library takes that, never the dict. Each block of
the config is a dataclass here: every field with its type and its doc (`python train.py --config FILE --help`
lists them, `field_docs`), and no default: the config files hold the values, once. Building a block refuses, in one
line naming the field, a field the block does not have (a typo in a config file), one it lacks, a value of the wrong
type and one outside the field's bounds; the checks that need the model, the devices or the files (preflight) come
after. (maxtext `src/MaxText/configs/types.py`: typed, validated sections; flax examples/lm1b: one config object
built at the entry.)

`config.method` becomes the `Method` it names (jaxemb/methods/); `config.evals` stays a plain mapping of blocks,
built into evaluators with their data (jaxemb/evaluation/evaluators/). `leaves` flattens a spec into the dotted
fields of its config, the names its run's fingerprint records.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Callable, ClassVar, Iterator, Mapping

from jaxemb import templates, views
from jaxemb.data import corpus
from jaxemb.errors import ConfigError
from jaxemb.methods.base import Method
from jaxemb.models import bert

Rule = Callable[[Any], "str | None"]  # A field's bound: why its value is refused, None when it holds.


def field(doc: str, rule: Rule | None = None) -> Any:
  """A block's field: its one-line doc (the first sentence is what --help shows) and its bound."""
  return dataclasses.field(metadata={"doc": " ".join(doc.split()), "rule": rule})


def at_least(least: int, hint: str = "") -> Rule:
  """An int of at least `least`: "must be a positive int" for 1, else "must be an int >= least"."""
  said = hint or ("must be a positive int" if least == 1 else f"must be an int >= {least}")
  return lambda value: None if value is None or value >= least else said


def one_of(choices: Any) -> Rule:
  """One of `choices` (a mapping: one of its keys), said sorted as a list (a tuple as given)."""
  shown = sorted(choices) if isinstance(choices, Mapping) else choices
  return lambda value: None if value in choices else f"must be one of {shown}"


def positive(unit: str) -> Rule:
  return lambda value: None if value > 0 else f"must be a positive number of {unit}"


class Block:
  """A config block as a frozen dataclass: WHERE is its dotted place in a config, `check` its rules across fields."""

  WHERE: ClassVar[str]

  @classmethod
  def from_config(cls, block: Any) -> Any:
    """The block `block` (a ConfigDict or mapping) describes; ConfigError for a stray, missing or bad field."""
    given = dict(block.items())
    names = [f.name for f in dataclasses.fields(cls)]
    for name in given:
      if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"its fields: {', '.join(names)}"
        raise ConfigError(f"{cls.WHERE}.{name}: no such field ({hint})")
    hints = typing.get_type_hints(cls)
    values = {f.name: _typed(cls, f, hints[f.name], given) for f in dataclasses.fields(cls)}
    built = cls(**values)
    built.check()
    return built

  def check(self):
    """Rules across this block's fields (one field's own are its `rule`)."""


def _typed(cls: type[Block], spec_field: dataclasses.Field, hint: Any, given: dict[str, Any]) -> Any:
  """`given`'s value of `spec_field`, checked against its type `hint` and rule; an absent optional block is None."""
  where = f"{cls.WHERE}.{spec_field.name}"
  kinds = _kinds(hint)
  if spec_field.name not in given:
    if type(None) in kinds and _block_kind(hint):
      return None
    raise ConfigError(f"{where}: missing; a {cls.WHERE} block sets every one of its fields")
  value = given[spec_field.name]
  if value is None and type(None) in kinds:
    return None
  kind = next(k for k in kinds if k is not type(None))
  value = _of_kind(kind, value, where)
  reason = spec_field.metadata["rule"] and spec_field.metadata["rule"](value)
  if reason:
    raise ConfigError(f"{where}={value!r}: {reason}")
  return value


def _kinds(hint: Any) -> tuple[Any, ...]:
  """The types a field's type admits: (int, NoneType) for `int | None`."""
  return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def _block_kind(hint: Any) -> type[Block] | None:
  """The Block a field's type holds (`Architecture | None`: Architecture), None for a value."""
  return next((k for k in _kinds(hint) if isinstance(k, type) and issubclass(k, Block)), None)


def _of_kind(kind: Any, value: Any, where: str) -> Any:
  """`value` as a `kind` (bool, int, float, str, tuple[str, ...], a Block, Method or a mapping)."""
  if isinstance(kind, type) and issubclass(kind, Block):
    return kind.from_config(value)
  if kind is Method:
    return Method.from_config(value)
  origin = typing.get_origin(kind)
  if origin is tuple and isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value):
    return tuple(value)
  if origin is dict and hasattr(value, "items"):
    return {key: dict(item.items()) if hasattr(item, "items") else item for key, item in value.items()}
  numbers = (int, float) if kind is float else (kind,)
  if origin is None and isinstance(value, numbers) and (kind is bool or not isinstance(value, bool)):
    return value
  raise ConfigError(f"{where}={value!r}: must be {_kind_name(kind)}")


def _kind_name(kind: Any) -> str:
  names = {bool: "True or False", int: "an int", float: "a number", str: "a string"}
  return names.get(kind, "a tuple of strings" if typing.get_origin(kind) is tuple else str(kind))


@dataclasses.dataclass(frozen=True)
class Architecture(Block):
  """An encoder built from scratch (configs/pretrain_mlm.py; prepare.py writes its folder)."""

  WHERE: ClassVar[str] = "config.model.architecture"
  tokenizer: str = field("Tokenizer (a local directory or hub id).")
  hidden_size: int = field("Width of every hidden state and of the word embeddings.", at_least(1))
  num_hidden_layers: int = field("Transformer layers.", at_least(1))
  num_attention_heads: int = field("Heads per layer.", at_least(1))
  intermediate_size: int = field("Feed-forward width.", at_least(1))
  max_position_embeddings: int = field("Longest input.", at_least(1))


@dataclasses.dataclass(frozen=True)
class Model(Block):
  """config.model of a training run: the checkpoint it starts from and how the encoder runs."""

  WHERE: ClassVar[str] = "config.model"
  path: str = field("Hugging Face hub id or local directory to start from.")
  dtype: str = field("Compute dtype (bfloat16 on accelerators); params and loss stay float32.")
  tie_word_embeddings: bool | None = field(
    """The MLM decoder: False gives it its own [vocab, hidden] matrix (HF `cls.predictions.decoder.weight`; a tied
    checkpoint's is initialised as a copy of its word embeddings), True ties it to the word embeddings (refused for
    an untied checkpoint: its decoder would be dropped). None: as the checkpoint (or architecture) has it."""
  )
  scan_layers: bool = field(
    """Run the layers as one nn.scan over params stacked on a leading axis (`layers/...`, maxtext's pattern): XLA
    compiles one layer instead of every one (bench/scan_layers.py). False: a module per layer (`layer_{i}/...`).
    Checkpoints written for Hugging Face and a run's best step read back per layer either way."""
  )
  scan_unroll: int | None = field(
    """Layers run per trip of the scan's loop (nn.scan's unroll; the same params, dropout and outputs, compiled
    differently). None: per backend (jaxemb.xla.scan_unroll): every layer on the CPU, where the loop cost a tenth of
    a step, unless the layers remat (unrolled whole they saved no memory); 1 elsewhere (one layer compiled). 1 also
    compiles faster on the CPU (tests at toy scale set it).""",
    at_least(1, "must be at least 1 (or None: per backend)"),
  )
  remat_policy: str = field(
    """What each layer keeps for the backward pass: "none" (everything), "full" (nothing: recomputed, about one more
    forward pass of compute for less activation memory), or a jax.checkpoint_policies name such as "dots_saveable"
    (keep the matmul outputs): jaxemb.models.bert.REMAT_POLICIES.""",
    one_of(bert.REMAT_POLICIES),
  )
  stack_encoder_calls: bool | None = field(
    """Run a step's encoder passes of near shapes (the views, the bias tables; jaxemb.training.encoder_calls) as one
    call, each with its own dropout masks. None: per backend (jaxemb.xla.stacks_encoder_calls): yes on
    accelerators, no on the CPU, where it was slower. True also compiles CoT-BERT's step faster (tests at toy scale
    set it)."""
  )
  architecture: Architecture | None = field("An encoder from scratch (configs/pretrain_mlm.py); absent: none.")


@dataclasses.dataclass(frozen=True)
class Data(Block):
  """config.data of a training run: the corpus, how its rows are built, and SentEval's folder."""

  WHERE: ClassVar[str] = "config.data"
  train_file: str = field("Training corpus (local or gs://; the default under $JAXEMB_DATA).")
  senteval_dir: str = field("SentEval's data/downstream folder (STS/, SICK/, MR/, ... MRPC/): the evaluators' data.")
  source: str = field('"senteval" (tokenised, lowercased files) or "raw" (the SemEval releases).')
  format: str = field(
    '"text": one sentence per line (column "text"); "nli": sent0,sent1,hard_neg CSV.', one_of(corpus.FORMATS)
  )
  max_sentence_tokens: int = field("Sentences are truncated to this many tokens; templates never are.", at_least(1))
  tokenization: str = field(
    """How training rows are built (templates.TOKENIZATIONS): "alone", the template ids around the sentence's own
    tokens, as the authors' `train.py` `prepare_features` (RoBERTa: no leading space on the sentence's first word);
    "in_context", the filled-in string tokenised at once.""",
    one_of(templates.TOKENIZATIONS),
  )
  cache_dir: str = field('Tokenised-corpus cache; "" = <workdir>/cache.')
  length_multiple: int = field(
    """Each global batch (and its template-bias rows) is padded to its longest row rounded up to a multiple of this:
    no step runs on 32 sentence tokens when its longest has 20, and at most 1 + 32 / 8 shapes compile. 0 = every
    batch at the template's width + max_sentence_tokens.""",
    at_least(0),
  )


@dataclasses.dataclass(frozen=True)
class Objective(Block):
  """config.objective: the loss, its views and what it trains (jaxemb.training.objectives.Objective)."""

  WHERE: ClassVar[str] = "config.objective"
  columns: tuple[str, ...] = field("The data column each view of the loss reads.")
  templates: tuple[str, ...] = field('The template of each view ("[X]": none).')
  pooling: str = field('"mask": last template [MASK] state; "cls": the [CLS] state.', one_of(views.POOLINGS))
  denoise: str = field("Template bias removed in the loss: none, position_offset, pad.")
  bias_positions: str = field(
    'Position-offset rows\' positions: "from_zero" (the authors pass arange(L), RoBERTa included) or "model" (HF\'s).',
    one_of(views.BIAS_POSITIONS),
  )
  head: str = field(
    "The projection each view goes through before the loss: mlp (fresh dense+tanh), mlm_transform (the MLM head's), "
    "or none."
  )
  keep_head: bool = field(
    """Keep the head for model selection and evaluation (the authors' --mlp_only_train off): a trained MLP becomes
    the checkpoint's pooler, as run.sh and SimCSE's simcse_to_huggingface.py rename mlp -> pooler."""
  )
  loss: str = field("info_nce, info_nce_with_hard_negatives, extended_info_nce, or mlm.")
  temperature: float = field("tau of the cosine logits.")
  whole_word_mask: bool = field(
    """loss "mlm": select whole words (all the WordPiece / byte-level pieces of a word together,
    jaxemb.training.mlm); False: each token on its own, as HF's DataCollatorForLanguageModeling."""
  )
  hard_negative_weight: float = field(
    """info_nce_with_hard_negatives: SimCSE's --hard_negative_weight, log of the weight on each row's own hard
    negative (0: all terms weigh 1, as every published run)."""
  )
  loss_group_size: int = field(
    "Rows per loss, losses averaged (CoT-BERT's 2 GPUs x 128); 0 = global batch.", at_least(0)
  )
  trainable: str = field('"all", or "prompt": OptiPrompt (encoder frozen).')
  prompt_placement: str = field(
    "OptiPrompt's vectors go to the last occurrence of each template token id (the authors'), or \"template\"."
  )
  freeze_padding_rows: bool = field("The [PAD] embedding rows HF's padding_idx never updates stay fixed.")
  ddp_world_size: int = field(
    """The authors' DDP processes (supervised runs: 4): each back-propagates the global loss through its own rows
    only and DDP averages, so the gradient is the global loss's / ddp_world_size (before clipping). 1 = the plain
    one.""",
    at_least(1),
  )

  def check(self):
    if len(self.columns) != len(self.templates):
      raise ConfigError(f"objective.columns {self.columns} and objective.templates need one entry per view")


@dataclasses.dataclass(frozen=True)
class Distributed(Block):
  """config.train.distributed: the job's hosts."""

  WHERE: ClassVar[str] = "config.train.distributed"
  coordinator_address: str = field(
    """host:port of process 0; "" = the job of the cluster jax.distributed.initialize() detects (a TPU pod slice, a
    SLURM job step, an Open MPI launch: the same command on every host), else a single process."""
  )
  num_processes: int = field("Processes in the job, with coordinator_address.", at_least(1))
  process_id: int = field("This process's index, with coordinator_address.", at_least(0))


@dataclasses.dataclass(frozen=True)
class Train(Block):
  """config.train: the optimizer, the schedule, checkpoints and the devices."""

  WHERE: ClassVar[str] = "config.train"
  batch_size: int = field("Global batch: in-batch negatives come from every device.")
  learning_rate: float = field("Peak learning rate, decayed linearly to 0.")
  epochs: int = field("Passes over the corpus (the last partial batch of each is dropped).")
  num_steps: int = field("Stop after this many steps instead; 0 = epochs x steps per epoch.", at_least(0))
  seed: int = field("Data order, dropout and head initialisation.")
  optimizer: str = field('"hf_adamw": transformers 4.2\'s AdamW (the authors\'); "optax_adamw".')
  weight_decay: float = field("AdamW weight decay (HF Trainer default 0).")
  adam_b1: float = field("AdamW beta1.")
  adam_b2: float = field("AdamW beta2.")
  adam_eps: float = field("AdamW epsilon.")
  max_grad_norm: float = field("Global-norm gradient clipping (HF Trainer's default, every reference); 0 = off.")
  save_every: int = field("Steps between train-state checkpoints (resume restarts from the latest).", at_least(1))
  keep_checkpoints: int = field("Train-state checkpoints kept.", at_least(1))
  log_every: int = field("Steps between metrics.jsonl / TensorBoard records.", at_least(1))
  prefetch: int = field("Batches gathered and sent to the devices while a step runs; 0 = none.", at_least(0))
  steps_per_call: int | None = field(
    """Optimizer steps per call of the jitted steps (one compiled loop; the same steps and bits whatever the split).
    None: per backend (jaxemb.xla.steps_per_call): 4 on the CPU, where each call maps and faults in the step's
    temporaries afresh; 1 elsewhere. A call ends early at an evaluation, a save, the last step or a batch of another
    width; a SIGTERM is answered once the call ends.""",
    at_least(1, "must be at least 1 (or None: per backend)"),
  )
  lease_seconds: float = field(
    """A run directory in a bucket is held by a lease of this many seconds (jaxemb/training/lease.py): a process
    that cannot renew it for 5/6 of it (a network outage, a stalled VM) stops, writing nothing more, and another
    process may take the run over once it is 7/6 old. Longer rides out longer outages and makes a takeover wait
    longer.""",
    positive("seconds"),
  )
  mesh_data: int = field("Devices on the data axis; -1 = all that fsdp leaves.")
  mesh_fsdp: int = field("Devices each param and optimizer state is split over.")
  distributed: Distributed = field("Multi-host: the job's coordinator and this process's place in it.")

  def check(self):
    if self.num_steps == 0 and self.epochs < 1:
      raise ConfigError(
        f"config.train.epochs={self.epochs}: must be a positive int when config.train.num_steps is 0 (or set num_steps)"
      )


@dataclasses.dataclass(frozen=True)
class Eval(Block):
  """config.eval of a training run: the sentence rules and encoder batches of its evaluations, and model selection
  (the step whose select_metric is highest is kept in best/)."""

  WHERE: ClassVar[str] = "config.eval"
  tasks: str = field("STS tasks scored after training (sweep.py), comma-separated; STS-B dev is always reported.")
  join_tokens: bool = field("SentEval's files are pre-tokenised: whitespace-split and re-join.")
  add_period: bool = field('Append "." to sentences without final punctuation (prompt methods).')
  batch_size: int = field("Sentences per encoder call.", at_least(1))
  length_multiple: int = field("Bucket rows to a multiple of this many tokens (padding vs compilations).", at_least(1))
  max_sentence_tokens: int = field("Truncate sentences to this many tokens; 0 = no truncation.", at_least(0))
  output_json: str = field('Where a job writes its results as JSON; "" = print only.')
  progress: bool = field("Show the encoding of an evaluation on stderr (a bar on a terminal, else a line every 30 s).")
  selection: str = field(
    """How the evaluators embed: "training_view", the authors' trainer (`sentemb_forward`: view 1's template around
    the sentence's own tokens, no ".", the objective's position-offset bias if select_denoise, the head if kept), or
    "eval_method": the run's evaluation method (config.method), with these sentence rules.""",
    one_of(("training_view", "eval_method")),
  )
  select_denoise: bool = field(
    "Subtract the objective's bias at selection (CoT-BERT passes --mask_embedding_sentence_delta_no_delta_eval: False)."
  )
  select_metric: str = field("A logged evaluator key, <evaluator>/<metric>: the highest is kept in best/.")


@dataclasses.dataclass(frozen=True)
class TrainingRun(Block):
  """A training run (train.py, sweep.py's training rows): configs/train_common.py's blocks."""

  WHERE: ClassVar[str] = "config"
  workdir: str = field("Run directory: model/, checkpoints/, best/, metrics.jsonl, tensorboard/.")
  compilation_cache_dir: str = field('Persistent XLA compilation cache ("": none).')
  model: Model = field("The checkpoint a run starts from and how the encoder runs.")
  data: Data = field("The corpus and SentEval's folder.")
  objective: Objective = field("The loss and its views.")
  train: Train = field("Optimizer, schedule, checkpoints, devices.")
  method: Method = field(
    """The run's evaluation method, recorded in its run directory (evaluate.py, Encoder.from_pretrained(workdir)):
    the authors' evaluation.py flags in run.sh (jaxemb/methods/)."""
  )
  eval: Eval = field("Evaluation and model selection.")
  evals: dict[str, Any] = field(
    """The evaluators by name (jaxemb/evaluation/evaluators/): each scores the training params every `every` steps
    and at the last one, logged as <name>/<metric>; add one with --config.evals.<name>.type=<type>."""
  )


def leaves(spec: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
  """(dotted name, value) of every field of `spec` as its config holds it: a block's fields under its name, the
  method as its flat block (`Method.config_fields`), each evaluator's fields."""
  for f in dataclasses.fields(spec):
    value = getattr(spec, f.name)
    if value is None and _block_kind(typing.get_type_hints(type(spec))[f.name]):
      continue  # An optional block left out.
    if isinstance(value, Block):
      yield from leaves(value, f"{prefix}{f.name}.")
    elif isinstance(value, Method):
      yield from _mapping_leaves(value.config_fields(), f"{prefix}{f.name}.")
    elif isinstance(value, dict):
      yield from _mapping_leaves(value, f"{prefix}{f.name}.")
    else:
      yield f"{prefix}{f.name}", value


def _mapping_leaves(tree: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, Any]]:
  for key, value in tree.items():
    if isinstance(value, Mapping):
      yield from _mapping_leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def field_docs(cls: type[Block], prefix: str = "") -> Iterator[tuple[str, str, str]]:
  """(dotted name, type, first sentence of its doc) of every field of block `cls`, nested blocks' fields in turn."""
  hints = typing.get_type_hints(cls)
  for f in dataclasses.fields(cls):
    block = _block_kind(hints[f.name])
    if block is not None:
      yield from field_docs(block, f"{prefix}{f.name}.")
    else:
      yield f"{prefix}{f.name}", _type_text(hints[f.name]), _first_sentence(f.metadata["doc"])


def _type_text(hint: Any) -> str:
  if isinstance(hint, type) and not typing.get_args(hint):
    return hint.__name__
  return str(hint).replace("typing.", "").replace("NoneType", "None")


def _first_sentence(doc: str) -> str:
  depth = 0
  for i, char in enumerate(doc):
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth == 0 and doc.startswith(". ", i):
      return doc[: i + 1]
  return doc
