r"""Ditto on the 7 STS tasks (Ditto Table 1: first-last 64.77 with bert-base-uncased at layer 0, head 9).

  python evaluate.py --config configs/eval_ditto.py --config.model.path=bert-base-uncased
  Heads found on STS-B dev: bert-base-uncased 0/9, roberta-base 0/4, electra-base 0/10, SBERT 2/6 (0-based).
  Ditto Table 2's ELECTRA row (the discriminator; prompt methods refuse it, it was trained without [MASK]):
  python evaluate.py --config configs/eval_ditto.py --config.model.path=google/electra-base-discriminator \
      --config.method.layer=0 --config.method.head=10
"""

from configs import eval_common


def get_config():
  config = eval_common.get_config()
  config.method.name = "ditto"
  config.method.layer = 0
  config.method.head = 9
  config.method.variant = "first_last"
  return config
