"""Unsupervised PromptBERT (BERT), kongds/Prompt-BERT `run.sh unsup-bert`: two templates as the positive pair,
position-offset template denoising in the loss and at model selection, the training-only MLP (PromptBERT Table 6:
78.54 with bert-base-uncased, batch 256, lr 1e-5, one epoch of wiki1m); evaluated with view 1's "of" template.

  python train.py --config configs/promptbert.py --config.workdir=runs/promptbert
"""

from configs import train_common


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/promptbert"
  return config
