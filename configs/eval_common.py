"""Fields shared by every evaluation config; the eval_*.py files set the method. Each field's type and meaning:
jaxemb/spec.py, or `python evaluate.py --config FILE --help`."""

import os

import ml_collections

STS_TASKS = "STS12,STS13,STS14,STS15,STS16,STSBenchmark,SICKRelatedness"
TRANSFER_TASKS = "MR,CR,SUBJ,MPQA,SST2,TREC,MRPC"
DATA_ENV = "JAXEMB_DATA"  # Names the data root of the default data paths (default: data).


def data_path(*parts: str) -> str:
  """A default data path: `parts` under $JAXEMB_DATA, read when the config is built."""
  return os.path.join(os.environ.get(DATA_ENV, "data"), *parts)


def method_config(name: str) -> ml_collections.ConfigDict:
  """config.method, the same block in evaluation and training configs: how a sentence becomes a vector. A config
  sets the name and the fields it changes; the commands add the named method's other fields at their defaults
  (jaxemb.cli.complete; `python evaluate.py --config FILE --help` lists them, jaxemb/methods/ documents them). A
  config that names another method than the one it builds on gives it a block of its own (configs/simcse.py)."""
  return ml_collections.ConfigDict({"name": name})


def add_senteval_fields(data: ml_collections.ConfigDict):
  """SentEval's folder in config.data, the same two fields in evaluation and training configs."""
  data.senteval_dir = data_path("senteval")  # SentEval's data/downstream folder (STS/, SICK/, MR/, ... MRPC/).
  data.source = "senteval"  # "senteval" (tokenised, lowercased files) or "raw" (the SemEval releases).


def eval_config() -> ml_collections.ConfigDict:
  """config.eval, the same block in evaluation and training configs: which STS tasks, the sentence rules and how
  the encoder batches (evaluate.py's jobs, training's evaluators, sweep.py's scoring of a trained run)."""
  block = ml_collections.ConfigDict()
  block.tasks = STS_TASKS
  block.join_tokens = True  # SentEval's files are pre-tokenised (SimCSE's evaluation.py re-joins them).
  block.add_period = False
  block.batch_size = 64
  block.length_multiple = 4  # Padding against compiled shapes: jaxemb.encode.Encoder measures both.
  block.compile_flops = -1.0  # The backend's: jaxemb.xla.compile_flops (0: each width its own shape).
  block.max_sentence_tokens = 0
  block.output_json = ""
  block.progress = True
  return block


def get_config():
  config = ml_collections.ConfigDict()
  config.job = "sts"
  config.compilation_cache_dir = "~/.cache/jaxemb/xla"

  config.model = ml_collections.ConfigDict()
  config.model.path = "bert-base-uncased"
  config.model.dtype = "float32"

  config.method = method_config("cls_before_pooler")  # One of jaxemb.methods.names(); the eval_*.py files set it.

  config.data = ml_collections.ConfigDict()
  add_senteval_fields(config.data)

  config.eval = eval_config()

  # The SentEval transfer tasks (jobs transfer and sts+transfer in jaxemb.evaluation.run; jaxemb.evaluation.transfer).
  config.transfer = ml_collections.ConfigDict()
  config.transfer.tasks = TRANSFER_TASKS
  config.transfer.mode = "test"  # The papers' numbers.
  config.transfer.seed = 1111  # SentEval's.
  return config
