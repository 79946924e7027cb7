r"""SentEval transfer tasks: jaxemb's JAX classifier against SentEval's own PyTorch classifier, same embeddings.

Every distinct sentence of the tasks is encoded once with jaxemb's Encoder (SentEval's batcher text: the tokens
joined with spaces) and cached in --cache; both sides read those vectors. The PyTorch side is SentEval's code
path written out (senteval/binary.py, sst.py, trec.py, mrpc.py; tools/validation.py; tools/classifier.py) with
the classifier settings of SimCSE's and Prompt-BERT's evaluation.py --mode test: usepytorch, kfold 10,
{nhid 0, optim adam, batch_size 64, tenacity 5, epoch_size 4}, seed 1111, on CPU. Folds come from sklearn's
StratifiedKFold when sklearn is importable, else from jaxemb's transcription of it (the script says which).
It prints per task the test (and dev) accuracy of both sides, their difference and each side's wall time.

  python bench/transfer_vs_senteval.py --model ../shared/models/all-MiniLM-L6-v2 \
      --senteval ../shared/data/senteval --method last_avg --cache /tmp/minilm_last_avg
"""

import argparse
import copy
import json
import pathlib
import sys
import time

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
# pylint: disable=g-import-not-at-top,wrong-import-position
from bench.common import print_load
from jaxemb.data import transfer as transfer_data
from jaxemb.data.sts import join_tokens
from jaxemb.encode import Encoder, Method
from jaxemb.evaluation import logreg, transfer

try:
  from sklearn.model_selection import StratifiedKFold
except ImportError:
  StratifiedKFold = None

# SimCSE's evaluation.py: params for --mode test and --mode fasttest.
PARAMS = {
  "test": {"kfold": 10, "classifier": {"nhid": 0, "optim": "adam", "batch_size": 64, "tenacity": 5, "epoch_size": 4}},
  "fasttest": {
    "kfold": 5,
    "classifier": {"nhid": 0, "optim": "rmsprop", "batch_size": 128, "tenacity": 3, "epoch_size": 2},
  },
}
SEED = 1111


def stratified_splits(y, n_splits, random_state):
  """StratifiedKFold(n_splits, shuffle=True, random_state).split(y) as a list."""
  if StratifiedKFold is not None:
    return list(StratifiedKFold(n_splits=n_splits, shuffle=True, random_state=random_state).split(y, y))
  return logreg.stratified_kfold(y, n_splits, random_state)


class MLP:
  """SentEval's PyTorchClassifier + MLP with nhid 0 (a logistic regression), on CPU."""

  def __init__(self, params, inputdim, nclasses, l2reg, seed=SEED):
    np.random.seed(seed)
    torch.manual_seed(seed)
    self.tenacity = params.get("tenacity", 5)
    self.epoch_size = params.get("epoch_size", 4)
    self.max_epoch = params.get("max_epoch", 200)
    self.batch_size = params.get("batch_size", 64)
    self.model = nn.Sequential(nn.Linear(inputdim, nclasses))
    self.loss_fn = nn.CrossEntropyLoss()
    self.loss_fn.size_average = False  # As SentEval; torch has ignored it since 0.4.1, so the loss is a mean.
    optim_fn = {"adam": torch.optim.Adam, "rmsprop": torch.optim.RMSprop}[params.get("optim", "adam")]
    self.optimizer = optim_fn(self.model.parameters())
    self.optimizer.param_groups[0]["weight_decay"] = l2reg
    self.nepoch = 0

  def fit(self, X, y, validation_data=None, validation_split=None):
    if validation_data is not None:
      train_x, train_y, dev_x, dev_y = X, y, *validation_data
    else:
      permutation = np.random.permutation(len(X))
      cut = int(validation_split * len(X))
      train_x, train_y = X[permutation[cut:]], y[permutation[cut:]]
      dev_x, dev_y = X[permutation[:cut]], y[permutation[:cut]]
    train_x, train_y = torch.FloatTensor(train_x), torch.LongTensor(train_y)
    best_accuracy, stop, early_stop_count = -1, False, 0
    while not stop and self.nepoch <= self.max_epoch:
      self.train_epoch(train_x, train_y)
      accuracy = self.score(dev_x, dev_y)
      if accuracy > best_accuracy:
        best_accuracy, best_model = accuracy, copy.deepcopy(self.model)
      else:
        if early_stop_count >= self.tenacity:
          stop = True
        early_stop_count += 1
    self.model = best_model
    return best_accuracy

  def train_epoch(self, X, y):
    self.model.train()
    for _ in range(self.epoch_size):
      permutation = np.random.permutation(len(X))
      for i in range(0, len(X), self.batch_size):
        idx = torch.from_numpy(permutation[i : i + self.batch_size])
        loss = self.loss_fn(self.model(X.index_select(0, idx)), y.index_select(0, idx))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
    self.nepoch += self.epoch_size

  def predict(self, X):
    self.model.eval()
    with torch.no_grad():
      X = torch.FloatTensor(X)
      return torch.cat(
        [self.model(X[i : i + self.batch_size]).max(1)[1] for i in range(0, len(X), self.batch_size)]
      ).numpy()

  def score(self, X, y):
    return 1.0 * int((self.predict(X) == np.asarray(y)).sum()) / len(X)


REGS = [10**t for t in range(-5, -1)]  # SentEval's grid when usepytorch.


def inner_kfold_classifier(X, y, config):
  """InnerKFoldClassifier.run (MR, CR, SUBJ, MPQA)."""
  devresults, testresults = [], []
  for train_idx, test_idx in stratified_splits(y, config["kfold"], 1111):
    X_train, X_test, y_train, y_test = X[train_idx], X[test_idx], y[train_idx], y[test_idx]
    scores = []
    for reg in REGS:
      regscores = []
      for inner_train_idx, inner_test_idx in stratified_splits(y_train, config["kfold"], 1111):
        clf = MLP(config["classifier"], X.shape[1], config["nclasses"], reg)
        clf.fit(
          X_train[inner_train_idx],
          y_train[inner_train_idx],
          validation_data=(X_train[inner_test_idx], y_train[inner_test_idx]),
        )
        regscores.append(clf.score(X_train[inner_test_idx], y_train[inner_test_idx]))
      scores.append(round(100 * np.mean(regscores), 2))
    optreg = REGS[np.argmax(scores)]
    devresults.append(np.max(scores))
    clf = MLP(config["classifier"], X.shape[1], config["nclasses"], optreg)
    clf.fit(X_train, y_train, validation_split=0.05)
    testresults.append(round(100 * clf.score(X_test, y_test), 2))
  return round(np.mean(devresults), 2), round(np.mean(testresults), 2), None


def kfold_classifier(train, test, config):
  """KFoldClassifier.run (TREC, MRPC): (dev acc, test acc, test predictions)."""
  scores = []
  for reg in REGS:
    scanscores = []
    for train_idx, test_idx in stratified_splits(train["y"], config["kfold"], SEED):
      clf = MLP(config["classifier"], train["X"].shape[1], config["nclasses"], reg)
      clf.fit(
        train["X"][train_idx], train["y"][train_idx], validation_data=(train["X"][test_idx], train["y"][test_idx])
      )
      scanscores.append(clf.score(train["X"][test_idx], train["y"][test_idx]))
    scores.append(round(100 * np.mean(scanscores), 2))
  optreg = REGS[np.argmax(scores)]
  clf = MLP(config["classifier"], train["X"].shape[1], config["nclasses"], optreg)
  clf.fit(train["X"], train["y"], validation_split=0.05)
  return np.max(scores), round(100 * clf.score(test["X"], test["y"]), 2), clf.predict(test["X"])


def split_classifier(X, y, config):
  """SplitClassifier.run (SST-2)."""
  scores = []
  for reg in REGS:
    clf = MLP(config["classifier"], X["train"].shape[1], config["nclasses"], reg)
    clf.fit(X["train"], y["train"], validation_data=(X["valid"], y["valid"]))
    scores.append(round(100 * clf.score(X["valid"], y["valid"]), 2))
  optreg = REGS[np.argmax(scores)]
  clf = MLP(config["classifier"], X["train"].shape[1], config["nclasses"], optreg)
  clf.fit(X["train"], y["train"], validation_data=(X["valid"], y["valid"]))
  return np.max(scores), round(100 * clf.score(X["test"], y["test"]), 2), None


def senteval_task(task, vectors, config):
  """One task the way SentEval's *Eval.run builds its inputs: token lists sorted by length, then label."""
  embed = lambda sentences: np.stack([vectors[" ".join(tokens)] for tokens in sentences]).astype(np.float32)
  config = {**config, "nclasses": task.num_classes}
  data = {}
  for name, split in task.splits.items():
    examples = sorted(
      zip(*[[s.split() for s in column] for column in split.columns], split.labels.tolist()),
      key=lambda z: (*(len(tokens) for tokens in z[:-1]), z[-1]),
    )
    columns = [embed([example[i] for example in examples]) for i in range(len(split.columns))]
    X = columns[0] if len(columns) == 1 else np.c_[np.abs(columns[0] - columns[1]), columns[0] * columns[1]]
    data[name] = {"X": X, "y": np.array([example[-1] for example in examples])}
  if "all" in data:
    return inner_kfold_classifier(data["all"]["X"], data["all"]["y"], config)
  if "dev" in data:
    return split_classifier(
      {"train": data["train"]["X"], "valid": data["dev"]["X"], "test": data["test"]["X"]},
      {"train": data["train"]["y"], "valid": data["dev"]["y"], "test": data["test"]["y"]},
      config,
    )
  devacc, acc, predictions = kfold_classifier(data["train"], data["test"], config)
  if task.name != "MRPC":
    return devacc, acc, None
  labels = data["test"]["y"]
  f1 = 2 * np.sum((predictions == 1) & (labels == 1)) / (np.sum(predictions == 1) + np.sum(labels == 1))
  return devacc, acc, round(100 * f1, 2)


def cached_vectors(args, tasks) -> dict[str, np.ndarray]:
  """Text -> vector for every distinct joined sentence of `tasks`, encoded once and kept in args.cache."""
  texts_path, vectors_path = pathlib.Path(args.cache + ".json"), pathlib.Path(args.cache + ".npy")
  texts = list(
    dict.fromkeys(
      join_tokens(s) for task in tasks for split in task.splits.values() for column in split.columns for s in column
    )
  )
  if texts_path.is_file() and vectors_path.is_file():
    cached = dict(zip(json.loads(texts_path.read_text()), np.load(vectors_path)))
    if cached.keys() >= set(texts):  # A cache of more tasks serves any subset of them.
      print(f"embeddings: {len(texts)} sentences from {vectors_path}")
      return cached
  encoder = Encoder.from_pretrained(args.model, Method(args.method))
  start = time.perf_counter()
  vectors = encoder.encode(texts, batch_size=args.batch_size)
  print(
    f"embeddings: {len(texts)} sentences encoded in {time.perf_counter() - start:.1f} s "
    f"({encoder.compilations} compiled shapes) -> {vectors_path}"
  )
  texts_path.write_text(json.dumps(texts))
  np.save(vectors_path, vectors)
  return dict(zip(texts, vectors))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, help="HF BERT/RoBERTa directory")
  parser.add_argument("--senteval", required=True, help="SentEval data/downstream folder")
  parser.add_argument("--method", default="last_avg", help="a jaxemb.encode method without a template")
  parser.add_argument("--tasks", default=",".join(transfer_data.TASKS))
  parser.add_argument("--mode", default="test", choices=sorted(PARAMS))
  parser.add_argument("--cache", default="/tmp/transfer_embeddings", help="cache path prefix (.json + .npy)")
  parser.add_argument("--batch-size", type=int, default=64)
  parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
  args = parser.parse_args()
  print_load("start")  # The CPU model beside every number.
  if args.threads:
    torch.set_num_threads(args.threads)
  print(f"folds: {'sklearn' if StratifiedKFold is not None else 'jaxemb.evaluation.logreg.stratified_kfold'}")
  tasks = transfer_data.load_transfer_tasks(args.senteval, args.tasks.split(","))
  vectors = cached_vectors(args, tasks)
  config = logreg.MODES[args.mode]
  rows = []
  for task in tasks:
    start = time.perf_counter()
    ours = transfer.evaluate_transfer(lambda s: np.stack([vectors[t] for t in s]), [task], join_tokens, config)
    ours_seconds = time.perf_counter() - start
    start = time.perf_counter()
    theirs = senteval_task(task, vectors, PARAMS[args.mode])
    theirs_seconds = time.perf_counter() - start
    rows.append((task.name, ours[task.name], theirs, ours_seconds, theirs_seconds))
    print(
      f"{task.name}: jaxemb {ours[task.name].acc:.2f} ({ours_seconds:.1f} s), "
      f"SentEval {theirs[1]:.2f} ({theirs_seconds:.1f} s)",
      flush=True,
    )
  print(
    f"\n{'task':<8} {'SentEval':>9} {'jaxemb':>8} {'diff':>6}   {'dev SE':>7} {'dev jax':>7}   "
    f"{'SentEval s':>10} {'jaxemb s':>9}"
  )
  for name, ours, (devacc, acc, f1), ours_seconds, theirs_seconds in rows:
    print(
      f"{name:<8} {acc:9.2f} {ours.acc:8.2f} {ours.acc - acc:6.2f}   {devacc:7.2f} {ours.devacc:7.2f}   "
      f"{theirs_seconds:10.1f} {ours_seconds:9.1f}"
    )
    if f1 is not None:
      print(f"{name + ' F1':<8} {f1:9.2f} {ours.f1:8.2f} {ours.f1 - f1:6.2f}")
  theirs_mean, ours_mean = np.mean([r[2][1] for r in rows]), np.mean([r[1].acc for r in rows])
  print(
    f"{'Avg.':<8} {theirs_mean:9.2f} {ours_mean:8.2f} {ours_mean - theirs_mean:6.2f}   {'':>7} {'':>7}   "
    f"{sum(r[4] for r in rows):10.1f} {sum(r[3] for r in rows):9.1f}"
  )
  print(f"max |diff| {max(abs(r[1].acc - r[2][1]) for r in rows):.2f} points")


if __name__ == "__main__":
  main()
