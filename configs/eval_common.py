"""Fields shared by every evaluation config; the eval_*.py files set the method."""

import os

import ml_collections

STS_TASKS = "STS12,STS13,STS14,STS15,STS16,STSBenchmark,SICKRelatedness"
TRANSFER_TASKS = "MR,CR,SUBJ,MPQA,SST2,TREC,MRPC"
DATA_ENV = "JAXEMB_DATA"  # Names the data root of the default data paths (default: data).


def data_path(*parts: str) -> str:
  """A default data path: `parts` under $JAXEMB_DATA, read when the config is built."""
  return os.path.join(os.environ.get(DATA_ENV, "data"), *parts)


def get_config():
  config = ml_collections.ConfigDict()
  # What evaluate.py runs: sts, transfer, sts+transfer, analysis, template_search, ditto_search, ditto_analysis
  # or fit_idf.
  config.job = "sts"
  config.compilation_cache_dir = "~/.cache/jaxemb/xla"  # Persistent XLA compilation cache ("": none).

  config.model = ml_collections.ConfigDict()
  config.model.path = "bert-base-uncased"  # Hugging Face hub id or local directory of a HF checkpoint.
  config.model.dtype = "float32"  # Compute dtype: float32, or bfloat16 on accelerators.

  config.method = ml_collections.ConfigDict()
  config.method.name = "cls_before_pooler"  # One of jaxemb.encode.METHODS.
  config.method.template = "[X]"  # "[X]" = the sentence alone; prompt methods need a [MASK] too.
  config.method.top_k = 200  # prompt_mlm_top_k: tokens averaged.
  config.method.ditto_layer = 0  # ditto: layer of the attention head (0-based).
  config.method.ditto_head = 9  # ditto: head (0-based).
  config.method.ditto_variant = "first_last"  # ditto: first_last, last, static (raw word rows), embedding_output (h0).
  config.method.denoise = False  # Prompt methods: subtract the position-offset template bias (supervised runs).
  config.method.head = "none"  # prompt: none, mlm_transform or pooler, applied after denoising (supervised runs).
  # "in_context": the filled-in template tokenised at once (the authors' evaluation.py, the published numbers);
  # "alone": the template ids around the sentence's own tokens (their training rows and dev scoring).
  config.method.tokenization = "in_context"
  config.method.bias_positions = "from_zero"  # denoise: template rows' positions from 0 (the authors'), or "model".
  config.method.prompt_placement = "last_occurrence"  # OptiPrompt runs: "last_occurrence" (the authors') or "template".
  config.method.idf_path = ""  # tfidf_first_last: IDF table JSON (`jaxemb.tfidf.save_idf`); "" for other methods.
  config.method.remove_frequent = True  # static_remove_biases: drop the 36 most frequent tokens.
  config.method.remove_subwords = True  # static_remove_biases: drop subword pieces.
  config.method.lowercase = True  # static_remove_biases: lowercase the kept words (case bias).
  config.method.remove_punctuation = True  # static_remove_biases: drop punctuation pieces.

  config.data = ml_collections.ConfigDict()
  config.data.senteval_dir = data_path("senteval")  # SentEval's data/downstream folder (STS/, SICK/, MR/, ... MRPC/).
  config.data.source = "senteval"  # "senteval" (tokenised, lowercased files) or "raw" (the SemEval releases).

  config.eval = ml_collections.ConfigDict()
  config.eval.tasks = STS_TASKS  # Comma-separated; STS-B dev is always reported as well.
  config.eval.join_tokens = True  # SentEval's files are pre-tokenised: whitespace-split and re-join.
  config.eval.add_period = False  # Append "." to sentences without final punctuation (prompt methods).
  config.eval.batch_size = 64  # Sentences per encoder call.
  config.eval.length_multiple = 4  # Bucket rows to a multiple of this many tokens (padding vs compilations).
  config.eval.max_sentence_tokens = 0  # Truncate sentences to this many tokens; 0 = no truncation.
  config.eval.output_json = ""  # Write the results here as JSON; "" = print only.

  # The SentEval transfer tasks (jobs transfer and sts+transfer; jaxemb.evaluation.transfer).
  config.transfer = ml_collections.ConfigDict()
  config.transfer.tasks = TRANSFER_TASKS  # Comma-separated, of jaxemb.data.transfer.TASKS.
  # Classifier settings of SimCSE's evaluation.py: "test" (the papers' numbers: 10 folds, Adam, batch 64,
  # tenacity 5, epoch size 4) or "fasttest" (5 folds, RMSprop, batch 128, tenacity 3, epoch size 2).
  config.transfer.mode = "test"
  config.transfer.seed = 1111  # SentEval's seed: classifier init, batch order, validation split, k-fold folds.
  return config
