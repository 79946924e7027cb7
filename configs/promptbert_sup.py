"""Supervised PromptBERT (BERT) on SimCSE's NLI triples, kongds/Prompt-BERT `run.sh sup-bert`: the "of" template for
premise, entailment and contradiction, denoised, through the pretrained MLM transform (--org_mlp: T(h) - T(b)) in
training, selection and evaluation; hard-negative InfoNCE (81.97; batch 512 = 4 GPUs x 128, lr 5e-5, 3 epochs)."""

from configs import eval_common, train_common


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/promptbert_sup"
  config.data.train_file = eval_common.data_path("nli_for_simcse.csv")
  config.data.format = "nli"
  config.objective.columns = ("sent0", "sent1", "hard_neg")
  config.objective.templates = (train_common.PROMPTBERT_OF,) * 3
  config.objective.head = "mlm_transform"
  config.objective.keep_head = True
  config.objective.loss = "info_nce_with_hard_negatives"
  # run.sh's evaluation: --mask_embedding_sentence_delta --mask_embedding_sentence_org_mlp.
  config.method.denoise = "position_offset"
  config.method.head = "mlm_transform"
  config.train.batch_size = 512
  config.objective.ddp_world_size = 4  # torch.distributed.launch --nproc_per_node 4, 128 rows each.
  config.train.learning_rate = 5e-5
  config.train.epochs = 3
  return config
