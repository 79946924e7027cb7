"""Supervised SimCSE (baseline) on SimCSE's NLI triples: entailment positive, contradiction hard negative."""

from configs import eval_common, simcse


def get_config():
  config = simcse.get_config()
  config.workdir = "runs/simcse_sup"
  config.data.train_file = eval_common.data_path("nli_for_simcse.csv")
  config.data.format = "nli"
  config.objective.columns = ("sent0", "sent1", "hard_neg")
  config.objective.templates = ("[X]",) * 3
  config.objective.loss = "info_nce_with_hard_negatives"
  config.train.batch_size = 512
  config.train.learning_rate = 5e-5
  config.train.epochs = 3
  return config
