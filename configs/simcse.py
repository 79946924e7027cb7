"""Unsupervised SimCSE (baseline), princeton-nlp/SimCSE `run_unsup_example.sh`: the same sentence twice, dropout the
only noise, [CLS] with the MLP in training only (76.25; batch 64, lr 3e-5, one epoch of wiki1m)."""

from configs import eval_common, train_common


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/simcse"
  # tokenizer(..., max_length=32, truncation=True) in SimCSE's train.py: 32 tokens with [CLS] and [SEP].
  config.data.max_sentence_tokens = 30
  config.objective.templates = ("[X]", "[X]")
  config.objective.pooling = "cls"
  config.objective.denoise = "none"
  config.train.batch_size = 64
  config.train.learning_rate = 3e-5
  config.method = eval_common.method_config("cls_before_pooler")
  config.eval.add_period = False
  return config
