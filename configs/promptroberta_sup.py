"""Supervised PromptRoBERTa on SimCSE's NLI triples (82.95): the RoBERTa template on every side, denoised, with
the training-only MLP; evaluated denoised, through the pretrained pooler (--use_pooler)."""

from configs import promptbert_sup, train_common


def get_config():
  config = promptbert_sup.get_config()
  config.workdir = "runs/promptroberta_sup"
  config.model.path = "roberta-base"
  config.objective.templates = (train_common.PROMPTROBERTA_T2,) * 3
  config.objective.projection = "mlp"
  config.eval.template = train_common.PROMPTROBERTA_T2
  config.eval.head = "pooler"
  return config
