"""PromptBERT Table 9: template denoising at test time, for the [MASK] state (Eq. 2) and the MLM head's top-200 tokens
(Eq. 3), on the untrained model (bert-base-uncased; needs an MLM head).

  python sweep.py --config configs/experiments/promptbert_table9.py
"""

from configs.experiments import common


def get_config():
  config = common.get_config()
  config.name = "PromptBERT Table 9"
  config.description = "Influence of template denoising in sentence embeddings (untrained, manual template)."
  config.workdir = "runs/experiments/promptbert_table9"
  config.base = "eval_prompt"
  config.rows = (
    {"name": "avg. top-200 tokens, no denoising", "paper": "56.19", "set": {"method.name": "prompt_mlm_top_k"}},
    {
      "name": "avg. top-200 tokens, denoising",
      "paper": "60.39",
      "set": {"method.name": "prompt_mlm_top_k", "method.denoise": "position_offset"},
    },
    {"name": "[MASK] token, no denoising", "paper": "67.85"},
    {"name": "[MASK] token, denoising", "paper": "67.43", "set": {"method.denoise": "position_offset"}},
  )
  return config
