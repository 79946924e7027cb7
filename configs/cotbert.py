"""CoT-BERT (BERT), ZBWpro/CoT-BERT `code-for-BERT/train.py`: two-stage templates with two [MASK]s, anchor / positive /
negation views, [PAD] template denoising and the extended InfoNCE (CoT-BERT: 79.40; 2 GPUs x 128, lr 1e-5, one epoch,
seed 0). The two `nn.DataParallel` replicas each computed their own bias tables and loss over 128 rows, averaged
(objective.loss_group_size); selection scores STS-B dev without the bias
(--mask_embedding_sentence_delta_no_delta_eval).
"""

from configs import train_common

# `_` in the authors' strings is a space: "means_*mask*_,_so" puts spaces around [MASK] and the comma.
ANCHOR = 'The sentence of "[X]" means [MASK] , so it can be summarized as [MASK] .'
POSITIVE = 'The sentence : "[X]" means [MASK] , so it can be summarized as [MASK] .'
NEGATIVE = 'The sentence : "[X]" does not mean [MASK] , so it cannot be summarized as [MASK] .'


def get_config():
  config = train_common.get_config()
  config.workdir = "runs/cotbert"
  config.objective.columns = ("text", "text", "text")
  config.objective.templates = (ANCHOR, POSITIVE, NEGATIVE)
  config.objective.denoise = "pad"
  config.objective.loss = "extended_info_nce"
  config.objective.loss_group_size = 128
  config.train.seed = 0
  config.method.template = ANCHOR
  config.eval.select_denoise = False
  return config
