"""Ditto's head search on STS-B dev: every layer x head, as many layers an encoder pass as 1 GiB of vectors holds.

  python evaluate.py --config configs/search_ditto.py --config.model.path=bert-base-uncased \
      --config.data.senteval_dir=../shared/data/senteval
"""

import ml_collections

from configs import eval_common


def get_config():
  config = eval_common.get_config()
  config.job = "ditto_search"
  config.method.name = "ditto"
  config.method.variant = "first_last"  # Which token vectors the diagonal weights (pooling.DITTO_VARIANTS).

  config.search = ml_collections.ConfigDict()
  config.search.show = 20  # Rows of the ranked table printed.
  return config
