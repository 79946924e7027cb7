"""Where token embeddings sit (PromptBERT Figures 1 and 2): a 2-D PCA of the model's token rows, one PNG per bias
(frequency, subword, case; jaxemb.evaluation.token_embeddings).

  python evaluate.py --config configs/eval_token_embeddings.py --config.model.path=runs/mlm_untied \
      --config.token_embeddings.rows=mlm_decoder --config.token_embeddings.output_dir=outputs/figures/mlm_untied
"""

import ml_collections

from configs import eval_common


def get_config():
  config = eval_common.get_config()
  config.job = "token_embeddings"
  config.token_embeddings = ml_collections.ConfigDict()  # The fields' meaning: jaxemb/spec.py (or --help).
  config.token_embeddings.rows = "word_embeddings"
  config.token_embeddings.corpus_file = eval_common.data_path("wiki1m_for_simcse.txt")
  config.token_embeddings.max_lines = 100000
  config.token_embeddings.output_dir = "outputs/token_embeddings"
  return config
