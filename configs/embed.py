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
  config.model = evaluation.model
  config.method = eval_common.method_config("")  # The model's own (Encoder.from_pretrained without a method).
  config.eval = evaluation.eval  # Its encoding fields: the encoder's batches, add_period, the progress.
  for name in _NOT_READ:
    del config.eval[name]
  # None: the method's own rule (a prompt method's "." as its evaluation adds it); True or False overrides it.
  config.eval.add_period = ml_collections.FieldReference(None, field_type=bool)

  config.embed = ml_collections.ConfigDict()  # The fields' meaning: jaxemb/spec.py's Embed (or --help).
  config.embed.corpus = ""
  config.embed.output = ""
  config.embed.format = "text"
  config.embed.text_column = "text"
  config.embed.id_column = ""
  config.embed.dtype = "float32"
  config.embed.normalize = False  # A sentence-transformers model with a Normalize module gives unit vectors anyway.
  config.embed.shard_rows = 100_000
  config.embed.batch_tokens = 0
  config.embed.fitted = ""
  config.embed.lease_seconds = 120.0
  return config
