"""Supervised PromptBERT (BERT) on SimCSE's NLI triples: one template for premise, entailment and contradiction,
denoised, through the pretrained MLM transform (--org_mlp); hard-negative InfoNCE (81.97; batch 512, lr 5e-5,
3 epochs)."""

from configs import eval_common, train_common


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/promptbert_sup"
  config.data.train_file = eval_common.data_path("nli_for_simcse.csv")
  config.data.format = "nli"
  config.objective.columns = ("sent0", "sent1", "hard_neg")
  config.objective.templates = (train_common.PROMPTBERT_T2,) * 3
  config.objective.projection = "mlm_transform"
  config.objective.loss = "info_nce_with_hard_negatives"
  config.eval.denoise = True  # The reference evaluates the supervised model denoised, through the MLM transform.
  config.eval.head = "mlm_transform"
  config.train.batch_size = 512
  config.train.learning_rate = 5e-5
  config.train.epochs = 3
  return config
