"""CoT-BERT Table 3: the two-stage templates against one stage, an irrelevant or static first stage and the stages
reversed (bert-base-uncased; the seed of configs/cotbert.py unless --config.seeds says otherwise).

  python sweep.py --config configs/experiments/cotbert_table3.py --config.seeds='(0,)'

The paper spells out the anchor template of each row and says the positive and negative ones are "treated in the same
manner"; those are written here by the same edit of configs/cotbert.py's POSITIVE and NEGATIVE templates.
"""

from configs.experiments import common

# (anchor, positive, negative) per row; the last row is configs/cotbert.py's.
TEMPLATES = {
  "only prefix": (
    'The sentence of "[X]" means [MASK] .',
    'The sentence : "[X]" means [MASK] .',
    'The sentence : "[X]" does not mean [MASK] .',
  ),
  "only suffix": (
    'The sentence of "[X]" can be summarized as [MASK] .',
    'The sentence : "[X]" can be summarized as [MASK] .',
    'The sentence : "[X]" cannot be summarized as [MASK] .',
  ),
  "irrelevant prefix + suffix": (
    'Penguin is a flightless bird , and the sentence of "[X]" can be summarized as [MASK] .',
    'Penguin is a flightless bird , and the sentence : "[X]" can be summarized as [MASK] .',
    'Penguin is a flightless bird , and the sentence : "[X]" cannot be summarized as [MASK] .',
  ),
  "static prefix + suffix": (
    'The sentence of "[X]" means something , so it can be summarized as [MASK] .',
    'The sentence : "[X]" means something , so it can be summarized as [MASK] .',
    'The sentence : "[X]" does not mean something , so it cannot be summarized as [MASK] .',
  ),
  "suffix + prefix": (
    'The sentence of "[X]" can be summarized as [MASK] , so it means [MASK] .',
    'The sentence : "[X]" can be summarized as [MASK] , so it means [MASK] .',
    'The sentence : "[X]" cannot be summarized as [MASK] , so it does not mean [MASK] .',
  ),
}
PAPER = {
  "only prefix": "78.91",
  "only suffix": "78.83",
  "irrelevant prefix + suffix": "78.44",
  "static prefix + suffix": "78.91",
  "suffix + prefix": "78.46",
}


def get_config():
  config = common.get_config()
  config.name = "CoT-BERT Table 3"
  config.description = "Comparative analysis of CoT-BERT's two-stage sentence representation (BERT base)."
  config.workdir = "runs/experiments/cotbert_table3"
  config.base = "cotbert"
  config.seeds = (0,)  # configs/cotbert.py's seed (the authors' train.py).
  config.rows = (
    *(
      {"name": name, "paper": PAPER[name], "set": {"objective.templates": templates, "method.template": templates[0]}}
      for name, templates in TEMPLATES.items()
    ),
    {"name": "prefix + suffix", "paper": "79.40"},
  )
  return config
