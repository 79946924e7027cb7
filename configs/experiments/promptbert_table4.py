"""PromptBERT Table 4: the templates of its greedy search, each scored on STS-B dev with the untrained model
(bert-base-uncased); the paper's numbers are STS-B dev, the "STS-B dev" column. The search itself, over every
candidate of each stage, is `evaluate.py --config configs/search_template.py`.

  python sweep.py --config configs/experiments/promptbert_table4.py

The paper prints curly quotes around [X]; the authors' code uses straight ones, as here.
"""

from configs.experiments import common

TEMPLATES = (  # (template, the paper's STS-B dev)
  ("[X] [MASK] .", "39.34"),  # Stage 1: the relation tokens between [X] and [MASK].
  ("[X] is [MASK] .", "47.26"),
  ("[X] mean [MASK] .", "53.94"),
  ("[X] means [MASK] .", "63.56"),
  ("This [X] means [MASK] .", "64.19"),  # Stage 2: the prefix tokens around [X].
  ("This sentence of [X] means [MASK] .", "68.97"),
  ('This sentence of "[X]" means [MASK] .', "70.19"),
  ('This sentence : "[X]" means [MASK] .', "73.44"),
)


def get_config():
  config = common.get_config()
  config.name = "PromptBERT Table 4"
  config.description = "Greedy searching templates on bert-base-uncased (paper: STS-B dev)."
  config.workdir = "runs/experiments/promptbert_table4"
  config.base = "eval_prompt"
  config.rows = tuple(
    {"name": template, "paper": f"dev {dev}", "set": {"method.template": template}} for template, dev in TEMPLATES
  )
  return config
