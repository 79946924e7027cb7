"""PromptBERT's greedy template search on STS-B dev (Table 4): relation tokens first, then prefixes around [X].

  python evaluate.py --config configs/search_template.py --config.model.path=bert-base-uncased \
      --config.data.senteval_dir=../shared/data/senteval
"""

import ml_collections

from configs import eval_common


def get_config():
  config = eval_common.get_config()
  config.job = "template_search"
  config.method.name = "prompt"  # The [MASK] state scores each template.
  config.method.template = "[X] [MASK] ."  # Replaced by each candidate.
  config.eval.add_period = True  # Prompt-BERT's evaluation appends "." to sentences without final punctuation.

  config.search = ml_collections.ConfigDict()  # The fields' meaning: jaxemb/spec.py (or --help).
  config.search.relations = ("", "is", "mean", "means")  # PromptBERT Table 4's relations.
  config.search.wrappers = (  # PromptBERT Table 4's prefixes.
    "This [X]",
    "This sentence of [X]",
    'This sentence of "[X]"',
    'This sentence : "[X]"',
  )
  config.search.show = 20
  config.search.templates_file = ""
  return config
