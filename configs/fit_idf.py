r"""Fits the IDF table of method tfidf_first_last and the ditto_analysis job (Ditto App. A.2: gensim's TfidfModel
IDF, log2(N / df), on 10^6 Wikipedia sentences), one sentence per line, with the model's tokenizer.

  python evaluate.py --config configs/fit_idf.py --config.model.path=bert-base-uncased \
      --config.idf.corpus=data/wiki1m_for_simcse.txt --config.idf.output=idf.json
"""

import ml_collections

from configs import eval_common


def get_config():
  config = eval_common.get_config()  # Reads model.path (its tokenizer) and compilation_cache_dir.
  config.job = "fit_idf"

  config.idf = ml_collections.ConfigDict()  # Each field's meaning: jaxemb/spec.py's Idf (or --help).
  config.idf.corpus = eval_common.data_path("wiki1m_for_simcse.txt")
  config.idf.output = ""  # Required.
  config.idf.chunk_size = 10_000
  return config
