"""Embeds a corpus with a model and method: one vector a record, in shards that a rerun continues (embed.py,
docs/embedding.md).

  python embed.py --config configs/embed.py --config.model.path=runs/promptbert \
      --config.embed.corpus=data/wiki1m_for_simcse.txt --config.embed.output=runs/promptbert/wiki1m
"""

import ml_collections

from configs import eval_common

# The fields of the evaluation block that embed.py does not read: the STS tasks, SentEval's re-join of its
# pre-tokenised text, a results file.
_NOT_READ = ("tasks", "join_tokens", "output_json")


def get_config():
  evaluation = eval_common.get_config()
  config = ml_collections.ConfigDict()
  config.compilation_cache_dir = evaluation.compilation_cache_dir
  config.model = evaluation.model  # path: a run directory (its best step) or a Hugging Face checkpoint; dtype.
  # "": a run directory's own evaluation method, a Hugging Face checkpoint's own sentence-transformers pooling
  # (Encoder.from_pretrained without a method); or any method named (last_avg, prompt with its template, ...).
  config.method = eval_common.method_config("")
  # The encoder's batches (batch_size, length_multiple, max_sentence_tokens), add_period (prompt methods' ".") and
  # the progress on stderr, as in evaluation.
  config.eval = evaluation.eval
  for name in _NOT_READ:
    del config.eval[name]

  config.embed = ml_collections.ConfigDict()
  config.embed.corpus = ""  # The file to embed (local or gs://).
  config.embed.output = ""  # The folder of the shards and manifest.json (local or gs://); a rerun continues it.
  # "text": one sentence a line (every line a record, blank ones too); "tsv" or "csv": a header line naming the
  # columns, the sentence in text_column, the record's id in id_column ("": its number, 0-based).
  config.embed.format = "text"
  config.embed.text_column = "text"
  config.embed.id_column = ""
  config.embed.dtype = "float32"  # Of the vectors written: float32 or float16.
  # True: scale each vector to unit length (cosine similarity is then a dot product); False: as the model's own
  # modules do (a sentence-transformers model with a Normalize module gives unit vectors either way).
  config.embed.normalize = False
  config.embed.shard_rows = 100_000  # Records a shard: its file, the memory a host holds, the work a kill loses.
  # The most rows x tokens of an encoder call (0: eval.batch_size rows at every width): long buckets then run with
  # fewer rows, which bounds a call's memory (attention grows with the width squared) when long sentences and a large
  # batch would not fit (Encoder's batch_tokens).
  config.embed.batch_tokens = 0
  # A method's fitted state (whitening, flow): the .npz evaluate.py writes beside its output_json; "": the model
  # folder's own fitted_state.npz, if any.
  config.embed.fitted = ""
  return config
