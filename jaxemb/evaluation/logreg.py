"""SentEval's transfer classifier: a logistic regression on frozen sentence vectors, trained as SentEval trains it.

The classifier is SentEval's PyTorch `MLP` with nhid=0 (`tools/classifier.py`), with the settings of SimCSE's
and Prompt-BERT's `evaluation.py --mode test`, which every transfer number in the papers uses (`MODES`):

- a linear layer starting from the very weights `torch.manual_seed(seed); nn.Linear(dim, classes)` draws (SentEval
  re-seeds torch for each classifier, so every fit starts there); softmax cross-entropy averaged over each batch
  (SentEval sets `size_average = False` on the loss after building it, which torch has ignored since 0.4.1);
- Adam (lr 1e-3) with the L2 penalty added to the gradient of every parameter (torch's `weight_decay`),
  batches of 64 in a fresh permutation per pass; `epoch_size` = 4 passes between two dev evaluations;
- early stopping on the dev rows: the best-on-dev weights are kept; training stops at the first evaluation
  that fails to improve after `tenacity` (5) earlier failures, which SentEval never resets, or after
  `max_epoch` (200) passes;
- the L2 weight is searched over 1e-5, 1e-4, 1e-3, 1e-2 by dev accuracy (rounded to 0.01 points, the first
  of equal scores wins);
- the batch order and the 5% validation split come from `np.random` re-seeded with the seed for each fit, as
  SentEval's; folds are sklearn's StratifiedKFold(shuffle=True).

So a fit follows SentEval's step for step: the same start, batches and stopping point, and weights equal to
float32 rounding (about 1e-6), hence the same accuracies up to the rare prediction that rounding flips.

SentEval's three validation schemes (`tools/validation.py`) run on it: `inner_kfold_classifier`
(InnerKFoldClassifier), `kfold_classifier` (KFoldClassifier) and `split_classifier` (SplitClassifier);
`jaxemb.evaluation.transfer` says which task takes which. Accuracies are in %, rounded to 0.01 at the same steps
as SentEval.

Every fold x L2 candidate of a stage trains at once: one jitted epoch advances all of them (vmapped), each
batch of rows is gathered once per fold and shared by its L2 candidates, and finished fits are frozen.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxemb.errors import ConfigError

_INNER_KFOLD_SEED = 1111  # InnerKFoldClassifier's folds: SentEval passes random_state=1111, not the seed.
# SentEval's optimiser names, with torch's defaults: Adam(lr=1e-3), RMSprop(lr=1e-2, alpha=0.99, eps outside sqrt).
_OPTIMIZERS = {
  "adam": lambda: optax.adam(1e-3),
  "rmsprop": lambda: optax.rmsprop(1e-2, decay=0.99, eps=1e-8, eps_in_sqrt=False),
}
_DEV_CHUNK = 256  # Dev rows scored per gather: bounds the [folds, rows, dim] temporary.


@dataclasses.dataclass(frozen=True)
class LogRegConfig:
  """SentEval's classifier settings (nhid 0); the defaults are SimCSE's `--mode test`."""

  kfold: int = 10  # Folds of the cross-validations.
  optim: str = "adam"  # "adam" or "rmsprop".
  batch_size: int = 64
  tenacity: int = 5  # Evaluations without improvement tolerated before stopping.
  epoch_size: int = 4  # Passes over the training rows between two dev evaluations.
  max_epoch: int = 200  # Training stops once this many passes are done.
  seed: int = 1111  # SentEval's: initialisation, batch order, validation split, KFold folds.
  regs: tuple[float, ...] = (1e-5, 1e-4, 1e-3, 1e-2)  # L2 weights searched (SentEval's pytorch grid).
  validation_split: float = 0.05  # Share of the training rows the final fits of the k-fold protocols stop on.

  def __post_init__(self):
    if self.optim not in _OPTIMIZERS:
      raise ConfigError(f"optim {self.optim!r} is not one of {sorted(_OPTIMIZERS)}")
    if self.kfold < 2 or min(self.batch_size, self.epoch_size, self.max_epoch + 1) < 1 or not self.regs:
      raise ValueError(f"bad classifier settings: {self}")

  @property
  def max_evaluations(self) -> int:
    """Dev evaluations of a fit that never stops early: SentEval trains while its pass count <= max_epoch."""
    return self.max_epoch // self.epoch_size + 1


# SimCSE's and Prompt-BERT's evaluation.py modes: "test" gives the papers' numbers, "fasttest" is quicker.
MODES = {
  "test": LogRegConfig(),
  "fasttest": LogRegConfig(kfold=5, optim="rmsprop", batch_size=128, tenacity=3, epoch_size=2),
}


@dataclasses.dataclass(frozen=True)
class Fold:
  """Rows of the feature matrix one classifier trains on and early-stops on.

  `drawn` is the length of the permutation drawn from the seeded stream before training (the validation
  split), which moves where the batch order starts.
  """

  train: np.ndarray
  dev: np.ndarray
  drawn: int = 0

  @classmethod
  def validation_split(cls, rows: np.ndarray, config: LogRegConfig) -> Fold:
    """SentEval's `validation_split`: the first `int(share * n)` of a seeded permutation of `rows` are dev."""
    permutation = np.random.RandomState(config.seed).permutation(len(rows))
    cut = int(config.validation_split * len(rows))
    return cls(rows[permutation[cut:]], rows[permutation[:cut]], drawn=len(rows))


@dataclasses.dataclass(frozen=True)
class Fits:
  """The kept (best-on-dev) classifier of each fold x L2 candidate."""

  weights: np.ndarray  # [folds, candidates, dim, classes]
  bias: np.ndarray  # [folds, candidates, classes]
  dev_accuracy: np.ndarray  # [folds, candidates] float64: share of its dev rows the kept classifier gets right.
  evaluations: np.ndarray  # [folds, candidates]: dev evaluations run before stopping.

  def predict(self, features: np.ndarray, fold: int = 0, candidate: int = 0) -> np.ndarray:
    logits = np.asarray(features, np.float32) @ self.weights[fold, candidate] + self.bias[fold, candidate]
    return logits.argmax(-1)


def stratified_kfold(labels: np.ndarray, n_splits: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
  """(train rows, test rows) of each fold, as sklearn's StratifiedKFold(n_splits, shuffle=True, random_state=seed).

  Classes are numbered by first appearance; the test-fold sizes of each class are dealt round-robin over its
  sorted labels; each class's fold numbers are laid out in blocks and shuffled by one RandomState(seed).
  """
  labels = np.asarray(labels)
  _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
  classes = np.argsort(np.argsort(first))[inverse]
  counts = np.bincount(classes)
  if n_splits < 2 or n_splits > len(labels) or np.all(counts < n_splits):
    raise ValueError(f"cannot make {n_splits} stratified folds of {len(labels)} rows with class counts {counts}")
  ordered = np.sort(classes)
  allocation = np.stack([np.bincount(ordered[i::n_splits], minlength=len(counts)) for i in range(n_splits)])
  rng = np.random.RandomState(seed)
  test_fold = np.empty(len(labels), np.int64)
  for k in range(len(counts)):
    folds = np.repeat(np.arange(n_splits), allocation[:, k])
    rng.shuffle(folds)
    test_fold[classes == k] = folds
  rows = np.arange(len(labels))
  return [(rows[test_fold != i], rows[test_fold == i]) for i in range(n_splits)]


def fit_logreg(
  features: np.ndarray,
  labels: np.ndarray,
  num_classes: int,
  folds: Sequence[Fold],
  regs: np.ndarray,
  config: LogRegConfig,
) -> Fits:
  """Trains one classifier per fold and per L2 weight in `regs[fold]` ([folds, candidates]), all at once."""
  regs = np.asarray(regs, np.float32)
  if regs.ndim != 2 or len(regs) != len(folds):
    raise ValueError(f"regs has shape {regs.shape}; expected [{len(folds)} folds, candidates]")
  for fold in folds:
    if not (len(fold.train) and len(fold.dev)):
      raise ValueError(f"a fold has {len(fold.train)} training and {len(fold.dev)} dev rows; both must be > 0")
  steps = math.ceil(max(len(f.train) for f in folds) / config.batch_size)
  train_rows, train_len = _pad([f.train for f in folds], config.batch_size * steps)
  dev_rows, dev_len = _pad([f.dev for f in folds], _DEV_CHUNK * math.ceil(max(len(f.dev) for f in folds) / _DEV_CHUNK))
  orders = _BatchOrders(folds, config, train_rows.shape[1])
  data = (
    jnp.asarray(features, jnp.float32),
    jnp.asarray(labels, jnp.int32),
    jnp.asarray(train_rows),
    jnp.asarray(train_len),
    jnp.asarray(dev_rows),
    jnp.asarray(dev_len),
    jnp.asarray(orders.group),
    jnp.asarray(regs),
  )
  state = _init_state(features.shape[1], num_classes, regs.shape, config)
  for _ in range(config.max_evaluations):
    state = _train_epoch(state, *data, jnp.asarray(orders.next_epoch()), config=config)
    if bool(state["stopped"].all()):
      break
  correct, sizes = np.asarray(state["best_correct"], np.float64), np.array([len(f.dev) for f in folds], np.float64)
  return Fits(
    np.asarray(state["best"]["w"]),
    np.asarray(state["best"]["b"]),
    correct / sizes[:, None],
    np.asarray(state["evaluations"]),
  )


def inner_kfold_classifier(
  features: np.ndarray, labels: np.ndarray, num_classes: int, config: LogRegConfig
) -> tuple[float, float]:
  """SentEval's InnerKFoldClassifier: (dev accuracy, test accuracy), both averaged over the outer folds."""
  regs = np.asarray(config.regs)
  outer = stratified_kfold(labels, config.kfold, _INNER_KFOLD_SEED)
  inner = [
    Fold(train[fit], train[held_out])
    for train, _ in outer
    for fit, held_out in stratified_kfold(labels[train], config.kfold, _INNER_KFOLD_SEED)
  ]
  search = fit_logreg(features, labels, num_classes, inner, np.tile(regs, (len(inner), 1)), config)
  # [outer, candidates, inner] so each mean runs over a contiguous row, as SentEval's np.mean of a list.
  scores = _mean_percent(search.dev_accuracy.reshape(len(outer), config.kfold, len(regs)).transpose(0, 2, 1))
  best = scores.argmax(1)
  final = fit_logreg(
    features,
    labels,
    num_classes,
    [Fold.validation_split(train, config) for train, _ in outer],
    regs[best][:, None],
    config,
  )
  tests = [_percent(final.predict(features[test], i) == labels[test]) for i, (_, test) in enumerate(outer)]
  return round(np.mean(scores.max(1)), 2), round(np.mean(tests), 2)


def kfold_classifier(
  train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], num_classes: int, config: LogRegConfig
) -> tuple[float, float, np.ndarray]:
  """SentEval's KFoldClassifier on (features, labels) pairs: (dev accuracy, test accuracy, test predictions)."""
  (x, y), regs = train, np.asarray(config.regs)
  folds = [Fold(fit, held_out) for fit, held_out in stratified_kfold(y, config.kfold, config.seed)]
  search = fit_logreg(x, y, num_classes, folds, np.tile(regs, (len(folds), 1)), config)
  scores = _mean_percent(search.dev_accuracy.T)
  final = fit_logreg(
    x, y, num_classes, [Fold.validation_split(np.arange(len(y)), config)], np.array([[regs[scores.argmax()]]]), config
  )
  predictions = final.predict(test[0])
  return scores.max(), _percent(predictions == test[1]), predictions


def split_classifier(
  train: tuple[np.ndarray, np.ndarray],
  dev: tuple[np.ndarray, np.ndarray],
  test: tuple[np.ndarray, np.ndarray],
  num_classes: int,
  config: LogRegConfig,
) -> tuple[float, float]:
  """SentEval's SplitClassifier: (dev accuracy, test accuracy) of the L2 weight best on dev.

  SentEval refits that weight with the same seed and data, which gives the same classifier: it is reused.
  """
  x, y = np.concatenate([train[0], dev[0]]), np.concatenate([train[1], dev[1]])
  folds = [Fold(np.arange(len(train[1])), len(train[1]) + np.arange(len(dev[1])))]
  search = fit_logreg(x, y, num_classes, folds, np.asarray([config.regs]), config)
  scores = [round(100 * float(accuracy), 2) for accuracy in search.dev_accuracy[0]]
  best = int(np.argmax(scores))
  return scores[best], _percent(search.predict(test[0], 0, best) == test[1])


class _BatchOrders:
  """SentEval's batch orders: every fit re-seeds np.random, so fits of one size (after the same validation-split
  draw) get the same permutations; one stream per such group."""

  def __init__(self, folds: Sequence[Fold], config: LogRegConfig, width: int):
    keys: dict[tuple[int, int], int] = {}
    self.group = np.array([keys.setdefault((len(f.train), f.drawn), len(keys)) for f in folds], np.int32)
    self.streams = []
    for size, drawn in keys:
      rng = np.random.RandomState(config.seed)
      if drawn:
        rng.permutation(drawn)  # The validation split comes first in SentEval's stream.
      self.streams.append((rng, size))
    self.shape = (len(keys), config.epoch_size, width)

  def next_epoch(self) -> np.ndarray:
    """[streams, epoch_size, width] int32: a fresh permutation of each stream's rows per pass, zero-padded."""
    orders = np.zeros(self.shape, np.int32)
    for (rng, size), order in zip(self.streams, orders):
      for one_pass in order:
        one_pass[:size] = rng.permutation(size)
    return orders


def _init_state(dim: int, num_classes: int, shape: tuple[int, int], config: LogRegConfig) -> dict[str, Any]:
  """The training state of [folds, candidates] fits, all starting where SentEval's classifier starts."""
  start = torch_linear_init(dim, num_classes, config.seed)
  params = jax.tree.map(lambda a: jnp.broadcast_to(a, shape + a.shape), start)
  return {
    "params": params,
    "opt": jax.vmap(jax.vmap(_OPTIMIZERS[config.optim]().init))(params),
    "best": params,
    "best_correct": jnp.full(shape, -1, jnp.int32),
    "misses": jnp.zeros(shape, jnp.int32),
    "stopped": jnp.zeros(shape, bool),
    "evaluations": jnp.zeros(shape, jnp.int32),
  }


def torch_linear_init(dim: int, num_classes: int, seed: int) -> dict[str, np.ndarray]:
  """The weights of `torch.manual_seed(seed); nn.Linear(dim, num_classes)`: "w" [dim, classes] and "b" [classes].

  torch's CPU generator is the MT19937 of numpy's RandomState(seed), and `uniform_(low, high)` maps the low 24 bits
  of each 32-bit draw to u / 2**24 * (high - low) + low, rounded once to float32. The weight draws first (row by
  row, bound from kaiming_uniform_ with a = sqrt(5)), then the bias (bound 1 / sqrt(dim)).
  """
  draws = np.random.RandomState(seed).randint(2**32, size=(dim + 1) * num_classes, dtype=np.uint32)
  units = (draws & 0xFFFFFF) * 2.0**-24

  def uniform(unit: np.ndarray, bound: float) -> np.ndarray:
    low, high = np.float32(-bound), np.float32(bound)
    return (unit * np.float64(high - low) + np.float64(low)).astype(np.float32)  # Exact product: one rounding.

  a = math.sqrt(5)  # nn.Linear.reset_parameters, with torch.nn.init's gain and bound arithmetic.
  weight_bound = math.sqrt(3.0) * (math.sqrt(2.0 / (1 + a**2)) / math.sqrt(dim))
  weight = uniform(units[: dim * num_classes], weight_bound).reshape(num_classes, dim).T
  return {"w": np.ascontiguousarray(weight), "b": uniform(units[dim * num_classes :], 1 / math.sqrt(dim))}


@functools.partial(jax.jit, static_argnames="config")
def _train_epoch(
  state: dict[str, Any],
  x: jax.Array,
  y: jax.Array,
  train_rows: jax.Array,
  train_len: jax.Array,
  dev_rows: jax.Array,
  dev_len: jax.Array,
  group: jax.Array,
  regs: jax.Array,
  orders: jax.Array,
  *,
  config: LogRegConfig,
) -> dict[str, Any]:
  """`epoch_size` passes of every running fit, then one dev evaluation and SentEval's early-stopping step.

  orders: [streams, epoch_size, padded rows] positions into each fold's training rows, per pass.
  """
  tx = _OPTIMIZERS[config.optim]()
  batch = config.batch_size
  steps = train_rows.shape[1] // batch
  running = ~state["stopped"]
  fold_orders = orders[group]  # [folds, epoch_size, padded rows]

  def step(t, carry):
    def fold(params, opt, rows, size, order, reg, active):
      start = (t % steps) * batch
      positions = jax.lax.dynamic_slice(order[t // steps], (start,), (batch,))
      valid = start + jnp.arange(batch) < size
      xb, yb = x[rows[positions]], y[rows[positions]]
      weight = valid / jnp.maximum(valid.sum(), 1)  # Mean over the batch's real rows (the last one is short).

      def candidate(p, o, l2, go):
        grads = jax.grad(_loss)(p, xb, yb, weight)
        grads = jax.tree.map(lambda g, w: g + l2 * w, grads, p)  # torch's weight_decay: L2 in the gradient.
        updates, new_o = tx.update(grads, o, p)
        keep = go & valid.any()  # A fold shorter than the longest has nothing left to do in its last steps.
        return _where(keep, optax.apply_updates(p, updates), p), _where(keep, new_o, o)

      return jax.vmap(candidate)(params, opt, reg, active)

    return jax.vmap(fold)(*carry, train_rows, train_len, fold_orders, regs, running)

  params, opt = jax.lax.fori_loop(0, config.epoch_size * steps, step, (state["params"], state["opt"]))
  correct = _dev_correct(params, x, y, dev_rows, dev_len)
  improved = running & (correct > state["best_correct"])
  failed = running & ~improved
  # SentEval's counter of failed evaluations is never reset: the failure after `tenacity` earlier ones stops.
  stops = failed & (state["misses"] >= config.tenacity)
  return {
    "params": params,
    "opt": opt,
    "best": _where(improved, params, state["best"]),
    "best_correct": jnp.where(improved, correct, state["best_correct"]),
    "misses": state["misses"] + failed,
    "stopped": state["stopped"] | stops,
    "evaluations": state["evaluations"] + running,
  }


def _loss(params: dict[str, jax.Array], x: jax.Array, y: jax.Array, weight: jax.Array) -> jax.Array:
  logits = x @ params["w"] + params["b"]
  return jnp.sum(weight * optax.softmax_cross_entropy_with_integer_labels(logits, y))


def _dev_correct(
  params: dict[str, jax.Array], x: jax.Array, y: jax.Array, dev_rows: jax.Array, dev_len: jax.Array
) -> jax.Array:
  """[folds, candidates] dev rows classified right, gathering `_DEV_CHUNK` rows per fold at a time."""

  def chunk(c, correct):
    rows = jax.lax.dynamic_slice_in_dim(dev_rows, c * _DEV_CHUNK, _DEV_CHUNK, axis=1)
    valid = c * _DEV_CHUNK + jnp.arange(_DEV_CHUNK) < dev_len[:, None]
    logits = jnp.einsum("fnd,fkdc->fknc", x[rows], params["w"]) + params["b"][:, :, None]
    hits = (logits.argmax(-1) == y[rows][:, None]) & valid[:, None]
    return correct + hits.sum(-1, dtype=jnp.int32)

  return jax.lax.fori_loop(0, dev_rows.shape[1] // _DEV_CHUNK, chunk, jnp.zeros(params["b"].shape[:2], jnp.int32))


def _where(mask: jax.Array, new: Any, old: Any) -> Any:
  """`new` where `mask` (leading dims of every leaf), else `old`."""
  return jax.tree.map(lambda a, b: jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b), new, old)


def _pad(rows: list[np.ndarray], width: int) -> tuple[np.ndarray, np.ndarray]:
  """([len(rows), width] int32 rows padded with 0, [len(rows)] lengths)."""
  padded = np.zeros((len(rows), width), np.int32)
  for out, r in zip(padded, rows):
    out[: len(r)] = r
  return padded, np.array([len(r) for r in rows], np.int32)


def _mean_percent(accuracies: np.ndarray) -> np.ndarray:
  """SentEval's round(100 * np.mean(scores), 2) over the last axis (contiguous, so summed in the same order)."""
  return np.round(100 * np.mean(np.ascontiguousarray(accuracies), axis=-1), 2)


def _percent(hits: np.ndarray) -> float:
  """SentEval's round(100 * clf.score(...), 2): the share of hits as a Python float, rounded to 0.01."""
  return round(100 * float(np.mean(hits)), 2)
