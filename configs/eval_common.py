"""Fields shared by every evaluation config; the eval_*.py files set the method."""

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
  sets the name and the fields it changes; the commands add the other fields of every method family of
  jaxemb/methods/ at their defaults (jaxemb.cli.complete), each documented in its family: tokenization;
  static_rows and static_remove_biases's four switches remove_frequent, remove_subwords, lowercase,
  remove_punctuation of `jaxemb.bias_removal.BiasFilter`; ditto_layer/head/variant; idf_path; template, top_k,
  denoise, head, bias_positions, prompt_placement; whitened_method, whitening_dims, whitening_corpus; flowed_method,
  flow_*); the named method reads those set away from their defaults.
  """
  return ml_collections.ConfigDict({"name": name})


def add_senteval_fields(data: ml_collections.ConfigDict):
  """SentEval's folder in config.data, the same two fields in evaluation and training configs."""
  data.senteval_dir = data_path("senteval")  # SentEval's data/downstream folder (STS/, SICK/, MR/, ... MRPC/).
  data.source = "senteval"  # "senteval" (tokenised, lowercased files) or "raw" (the SemEval releases).


def eval_config() -> ml_collections.ConfigDict:
  """config.eval, the same block in evaluation and training configs: which STS tasks, the sentence rules and how
  the encoder batches (evaluate.py's jobs, training's evaluators, sweep.py's scoring of a trained run)."""
  block = ml_collections.ConfigDict()
  block.tasks = STS_TASKS  # Comma-separated; STS-B dev is always reported as well.
  block.join_tokens = True  # SentEval's files are pre-tokenised: whitespace-split and re-join.
  block.add_period = False  # Append "." to sentences without final punctuation (prompt methods).
  block.batch_size = 64  # Sentences per encoder call.
  block.length_multiple = 4  # Bucket rows to a multiple of this many tokens (padding vs compilations).
  block.max_sentence_tokens = 0  # Truncate sentences to this many tokens; 0 = no truncation.
  block.output_json = ""  # Where evaluate.py's job writes its results as JSON; "" = print only.
  # Show the encoding of the sts and transfer jobs (and sweep.py's scoring) on stderr: the tasks, sentences done of
  # all, sentences/s, time left on a terminal's bar; where stderr is no terminal (nohup, CI logs) a line every
  # 30 s and one once each encoder call is done. False: quiet. Training's own evaluations keep their bar on a
  # terminal only.
  block.progress = True
  return block


def get_config():
  config = ml_collections.ConfigDict()
  # What evaluate.py runs: sts, transfer, sts+transfer, analysis, template_search, ditto_search, ditto_analysis
  # or fit_idf.
  config.job = "sts"
  config.compilation_cache_dir = "~/.cache/jaxemb/xla"  # Persistent XLA compilation cache ("": none).

  config.model = ml_collections.ConfigDict()
  config.model.path = "bert-base-uncased"  # Hugging Face hub id or local directory of a HF checkpoint.
  config.model.dtype = "float32"  # Compute dtype: float32, or bfloat16 (accelerators; CPUs with AVX512-BF16 or AMX).

  config.method = method_config("cls_before_pooler")  # One of jaxemb.methods.names(); the eval_*.py files set it.

  config.data = ml_collections.ConfigDict()
  add_senteval_fields(config.data)

  config.eval = eval_config()

  # The SentEval transfer tasks (jobs transfer and sts+transfer in jaxemb.evaluation.run; jaxemb.evaluation.transfer).
  config.transfer = ml_collections.ConfigDict()
  config.transfer.tasks = TRANSFER_TASKS  # Comma-separated, of jaxemb.data.transfer.TASKS.
  # Classifier settings of SimCSE's evaluation.py: "test" (the papers' numbers: 10 folds, Adam, batch 64,
  # tenacity 5, epoch size 4) or "fasttest" (5 folds, RMSprop, batch 128, tenacity 3, epoch size 2).
  config.transfer.mode = "test"
  config.transfer.seed = 1111  # SentEval's seed: classifier init, batch order, validation split, k-fold folds.
  return config
