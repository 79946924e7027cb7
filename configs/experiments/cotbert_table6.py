"""CoT-BERT Table 6: template denoising in the loss: none, PromptBERT's position offset, CoT-BERT's [PAD] rows.

python sweep.py --config configs/experiments/cotbert_table6.py            # BERT column
python sweep.py --config configs/experiments/cotbert_table6.py:roberta    # RoBERTa column
"""

from configs.experiments import common

PAPER = {"bert": ("78.69", "78.89", "79.40"), "roberta": ("79.87", "79.95", "80.62")}
BASE = {"bert": "cotbert", "roberta": "cotroberta"}


def get_config(model: str = "bert"):
  common.check_model("cotbert_table6", model, BASE)
  none, position, pad = PAPER[model]
  config = common.get_config()
  config.name = f"CoT-BERT Table 6 ({model})"
  config.description = "Ablation of CoT-BERT's template denoising strategy."
  config.workdir = f"runs/experiments/cotbert_table6_{model}"
  config.base = BASE[model]
  config.seeds = (0,)  # The configs' seed (the authors' train.py).
  config.rows = (
    {"name": "without denoise", "paper": none, "set": {"objective.denoise": "none"}},
    {"name": "position denoise", "paper": position, "set": {"objective.denoise": "position_offset"}},
    {"name": "[PAD] denoise", "paper": pad},
  )
  return config
