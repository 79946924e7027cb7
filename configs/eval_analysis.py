r"""Embedding-space analyses of one method: sentence anisotropy and static token-embedding cosine (PromptBERT
Eq. 1, Table 2), alignment and uniformity on STS-B test (CoT-BERT Table 5), the MLM head's top tokens at [MASK]
with and without template denoising (PromptBERT Table 7; needs an MLM head), and a cosine-vs-gold scatter
(CoT-BERT Fig. 3).

  python evaluate.py --config configs/eval_analysis.py --config.model.path=bert-base-uncased \
      --config.data.senteval_dir=../shared/data/senteval \
      --config.analysis.sample_file=../shared/data/wiki/wiki1m_sample.txt --config.analysis.scatter_png=stsb.png
"""

import ml_collections

from configs import eval_common


def get_config():
  config = eval_common.get_config()
  config.job = "analysis"
  config.method.name = "prompt"
  config.method.template = 'This sentence : "[X]" means [MASK] .'  # RoBERTa: "This sentence : ' [X] ' means [MASK] ."
  config.eval.add_period = True  # Prompt-BERT's evaluation appends "." to sentences without final punctuation.

  # Each field's meaning: jaxemb/spec.py's Analysis (or --help); here the values and where they come from.
  config.analysis = ml_collections.ConfigDict()
  config.analysis.sample_file = eval_common.data_path("wiki1m_for_simcse.txt")  # SimCSE's wiki1m.
  config.analysis.sample_size = 100_000  # PromptBERT's.
  config.analysis.sample_order = "first"  # kongds/Prompt-BERT's code ("random": the papers' wording).
  config.analysis.sample_seed = 0
  config.analysis.sample_max_words = 32  # Prompt-BERT's code.
  config.analysis.sample_lowercase = True  # Prompt-BERT's code.
  config.analysis.positive_threshold = 4.0
  config.analysis.positive_inclusive = False  # > 4 (True: >= 4, the code posted in SimCSE issue #41).
  config.analysis.top_k = 5  # PromptBERT Table 7.
  config.analysis.top_k_sentences = (  # PromptBERT Table 7's.
    "i am sad.",
    "i am not happy.",
    "the man is playing the guitar.",
    "the man is playing the piano.",
  )
  config.analysis.scatter_png = ""
  config.analysis.scatter_normalize = False  # True: as CoT-BERT Fig. 3.
  return config
