"""Ditto Table 2: first-last average, the last manual prompt and first-last Ditto on one pre-trained model, Ditto with
the head the paper selected for it on STS-B dev (0-based: BERT layer 0 head 9, RoBERTa 0/4, ELECTRA 0/10).

  python sweep.py --config configs/experiments/ditto_table2.py            # bert-base-uncased column
  python sweep.py --config configs/experiments/ditto_table2.py:roberta    # roberta-base
  python sweep.py --config configs/experiments/ditto_table2.py:electra    # google/electra-base-discriminator

ELECTRA's column has no prompt row: its discriminator was trained without [MASK], and the prompt methods refuse it
(the paper's 19.44 is that of a [MASK] the model never learned).
"""

from configs.experiments import common

MODELS = {"bert": "bert-base-uncased", "roberta": "roberta-base", "electra": "google/electra-base-discriminator"}
HEADS = {"bert": (0, 9), "roberta": (0, 4), "electra": (0, 10)}  # Ditto §A.2: heads 1-10, 1-5 and 1-11.
PAPER = {"bert": ("56.70", "67.85", "64.77"), "roberta": ("56.57", "61.08", "61.96"), "electra": ("36.28", "", "52.00")}
# The manual prompt's fields beyond configs/eval_prompt.py's (whose template is BERT's); ELECTRA has no prompt row.
PROMPT = {"bert": {}, "roberta": {"method.template": "This sentence : ' [X] ' means [MASK] ."}}


def get_config(model: str = "bert"):
  common.check_model("ditto_table2", model, MODELS)
  average, prompt, ditto = PAPER[model]
  layer, head = HEADS[model]
  config = common.get_config()
  config.name = f"Ditto Table 2 ({MODELS[model]})"
  config.description = "Ditto and learning-free baselines on a pre-trained model (7 STS tasks, Spearman x100)."
  config.workdir = f"runs/experiments/ditto_table2_{model}"
  config.base = "eval_baselines"
  path = {"model.path": MODELS[model]}
  prompt_row = {
    "name": "Last manual prompt",
    "paper": prompt,
    "base": "eval_prompt",
    "set": {**path, **PROMPT.get(model, {})},
  }
  config.rows = (
    {"name": "First-last avg.", "paper": average, "set": {**path, "method.name": "first_last_avg"}},
    *([prompt_row] if model in PROMPT else []),
    {
      "name": "First-last Ditto",
      "paper": ditto,
      "base": "eval_ditto",
      "set": {**path, "method.layer": layer, "method.head": head},
    },
  )
  return config
