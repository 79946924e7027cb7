"""Supervised SimCSE (baseline), princeton-nlp/SimCSE `run_sup_example.sh`, on its NLI triples: entailment positive,
contradiction hard negative; no --mlp_only_train, so the trained MLP is kept (simcse_to_huggingface.py makes it the
pooler) and evaluation reads the pooler output (--pooler cls)."""

from configs import eval_common, simcse


def get_config():
  config = simcse.get_config()
  config.workdir = "runs/simcse_sup"
  config.data.train_file = eval_common.data_path("nli_for_simcse.csv")
  config.data.format = "nli"
  config.objective.columns = ("sent0", "sent1", "hard_neg")
  config.objective.templates = ("[X]",) * 3
  config.objective.loss = "info_nce_with_hard_negatives"
  config.objective.keep_head = True
  config.train.batch_size = 512
  config.objective.ddp_world_size = 4  # torch.distributed.launch --nproc_per_node 4, 128 rows each.
  config.train.learning_rate = 5e-5
  config.train.epochs = 3
  config.method.name = "cls"  # The trained MLP, saved as the run's pooler.
  return config
