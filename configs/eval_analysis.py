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

  config.analysis = ml_collections.ConfigDict()
  # Anisotropy sentences, one per line (SimCSE's wiki1m).
  config.analysis.sample_file = eval_common.data_path("wiki1m_for_simcse.txt")
  config.analysis.sample_size = 100_000  # Anisotropy over this many lines (PromptBERT: 100,000).
  # "first": the first lines (kongds/Prompt-BERT's code); "random": a uniform sample (the papers' wording).
  config.analysis.sample_order = "first"
  config.analysis.sample_seed = 0  # The random sample's seed.
  config.analysis.sample_max_words = 32  # Keep this many words of each sample line (Prompt-BERT's code); 0 = all.
  config.analysis.sample_lowercase = True  # Lowercase the sample lines, as Prompt-BERT's code does.
  config.analysis.positive_threshold = 4.0  # Alignment positives: STS-B test pairs with gold above this.
  config.analysis.positive_inclusive = False  # True: gold >= threshold (code posted in SimCSE issue #41), not >.
  config.analysis.top_k = 5  # Tokens listed per sentence at [MASK] (PromptBERT Table 7: 5).
  config.analysis.top_k_sentences = (  # Sentences for the [MASK] top tokens (Table 7's); () = skip.
    "i am sad.",
    "i am not happy.",
    "the man is playing the guitar.",
    "the man is playing the piano.",
  )
  config.analysis.scatter_png = ""  # Write the STS-B test cosine-vs-gold scatter here; "" = no plot.
  config.analysis.scatter_normalize = False  # Min-max scale the cosines to [0, 1] as CoT-BERT Fig. 3 does.
  return config
