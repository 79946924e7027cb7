"""OptiPrompt on PromptBERT's manual template, kongds/Prompt-BERT `run.sh bert-optiprompt`: the encoder frozen; the
continuous template vectors (initialised from the manual template's static token embeddings, placed at the last
occurrence of each token id as the authors' code does) and the pretrained MLM transform as the head (--org_mlp,
--mlp_only_train: training only) learn with SimCSE's unsupervised objective (the same sentence twice, dropout the
noise). PromptBERT Table 5: 73.59 (batch 256, lr 3e-5, 5 epochs, STS-B dev every 1000 steps)."""

from configs import train_common


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/optiprompt"
  config.objective.templates = (train_common.PROMPTBERT_COLON,) * 2
  config.objective.denoise = "none"
  config.objective.head = "mlm_transform"
  config.objective.trainable = "prompt"
  config.train.learning_rate = 3e-5
  config.train.epochs = 5
  config.evals.stsb_dev.every = 1000
  config.train.save_every = 1000
  config.method.template = train_common.PROMPTBERT_COLON
  return config
