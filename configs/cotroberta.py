"""CoT-RoBERTa, ZBWpro/CoT-BERT `code-for-RoBERTa/train.py`: CoT-BERT's objective on roberta-base with the `' [X] '`
templates (80.62). The training strings end in "_._*sep+*", a space before the end: training rows, [PAD] rows and
selection carry a trailing `Ġ` token; `code-for-RoBERTa/evaluation.py` strips the filled-in string, so evaluation
does not."""

from configs import cotbert


def roberta(template: str) -> str:
  return template.replace('"[X]"', "' [X] '")


def get_config():
  config = cotbert.get_config()
  config.workdir = "runs/cotroberta"
  config.model.path = "roberta-base"
  config.objective.templates = tuple(roberta(t) + " " for t in config.objective.templates)
  config.method.template = roberta(cotbert.ANCHOR)
  return config
