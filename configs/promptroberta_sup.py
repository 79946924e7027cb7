"""Supervised PromptRoBERTa on SimCSE's NLI triples, kongds/Prompt-BERT `run.sh sup-roberta` (82.95): the RoBERTa
template on every side, denoised, with a fresh dense + tanh that trains and is KEPT (no --mlp_only_train): run.sh
renames it `pooler`, and evaluation (--use_pooler) is tanh(W(h - b)) with the trained weights."""

from configs import promptbert_sup, train_common


def get_config():
  config = promptbert_sup.get_config()
  config.workdir = "runs/promptroberta_sup"
  config.model.path = "roberta-base"
  config.objective.templates = (train_common.PROMPTROBERTA_THIS,) * 3
  config.objective.head = "mlp"
  config.method.template = train_common.PROMPTROBERTA_THIS
  config.method.head = "pooler"  # The trained MLP, saved as the run's pooler.
  return config
