"""Unsupervised PromptRoBERTa, kongds/Prompt-BERT `run.sh unsup-roberta`: PromptBERT's objective on roberta-base with
the RoBERTa templates in the authors' order (79.15); evaluated with view 1."""

from configs import train_common


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/promptroberta"
  config.model.path = "roberta-base"
  config.objective.templates = (train_common.PROMPTROBERTA_THIS, train_common.PROMPTROBERTA_THE)
  config.method.template = train_common.PROMPTROBERTA_THIS
  return config
