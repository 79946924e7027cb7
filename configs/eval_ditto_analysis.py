r"""Ditto's analyses of word importance (Ditto Tables 3-4, Figs. 1-2): diagonal attention of every head and the
perturbed-masking impact matrix, each against TF-IDF, with the heads ranked by Ditto's STS-B dev score.

  python evaluate.py --config configs/eval_ditto_analysis.py --config.model.path=bert-base-uncased \
      --config.data.senteval_dir=../shared/data/senteval \
      --config.ditto_analysis.sample_file=../shared/data/wiki/wiki1m_sample.txt \
      --config.ditto_analysis.idf_path=idf.json --config.ditto_analysis.output_md=ditto.md \
      --config.ditto_analysis.impact_png=impact.png --config.ditto_analysis.attention_png=attention.png
"""

import ml_collections

from configs import eval_common


def get_config():
  config = eval_common.get_config()
  config.job = "ditto_analysis"
  config.method.name = "ditto"  # The heads are ranked by Ditto with method.variant (first_last: Table 4's).

  # Each field's meaning: jaxemb/spec.py's DittoAnalysis (or --help); here the values and where they come from.
  config.ditto_analysis = ml_collections.ConfigDict()
  config.ditto_analysis.idf_path = ""  # Required: evaluate.py --config configs/fit_idf.py writes it.
  # Ditto uses STS-B's sentences for Table 4 and 1K English PUD treebank ones for Table 3; neither is offline.
  config.ditto_analysis.sample_file = eval_common.data_path("wiki1m_for_simcse.txt")
  config.ditto_analysis.sample_size = 200
  config.ditto_analysis.sample_order = "random"  # The papers' wording.
  config.ditto_analysis.sample_seed = 0
  config.ditto_analysis.tfidf_normalize = True  # gensim TfidfModel's default.
  config.ditto_analysis.top_heads = 4
  config.ditto_analysis.impact_size = 100
  config.ditto_analysis.impact_max_tokens = 32
  config.ditto_analysis.impact_batch_size = 256
  config.ditto_analysis.figure_sentence = (  # Ditto Figs. 1-2's.
    "For those who follow social media transitions on Capitol Hill, this will be a little different."
  )
  config.ditto_analysis.impact_png = ""
  config.ditto_analysis.attention_png = ""
  config.ditto_analysis.output_md = ""
  return config
