"""PromptBERT Table 3: static token-embedding averages with the biased tokens removed, one kind more per row.

  python sweep.py --config configs/experiments/promptbert_table3.py:uncased    # bert-base-uncased column
  python sweep.py --config configs/experiments/promptbert_table3.py:cased      # bert-base-cased
  python sweep.py --config configs/experiments/promptbert_table3.py:roberta    # roberta-base

The paper has no case row for uncased BERT (its vocabulary has no upper case); here that row runs and equals the one
above it.
"""

from configs.experiments import common

MODELS = {"uncased": "bert-base-uncased", "cased": "bert-base-cased", "roberta": "roberta-base"}
# Rows: (name, removed kinds, the paper's cased / uncased / roberta numbers).
ROWS = (
  ("Static Token Embeddings", (), ("56.93", "56.02", "55.88")),
  ("- Freq.", ("remove_frequent",), ("60.27", "59.65", "65.41")),
  ("- Freq. & Sub.", ("remove_frequent", "remove_subwords"), ("64.83", "62.20", "64.89")),
  ("- Freq. & Sub. & Case", ("remove_frequent", "remove_subwords", "lowercase"), ("65.07", "–", "65.06")),
  (
    "- Freq. & Sub. & Case & Pun.",
    ("remove_frequent", "remove_subwords", "lowercase", "remove_punctuation"),
    ("66.05", "63.10", "67.64"),
  ),
)
SWITCHES = ("remove_frequent", "remove_subwords", "lowercase", "remove_punctuation")


def get_config(model: str = "uncased"):
  common.check_model("promptbert_table3", model, MODELS)
  column = ("cased", "uncased", "roberta").index(model)
  config = common.get_config()
  config.name = f"PromptBERT Table 3 ({MODELS[model]})"
  config.description = "The influence of static embedding biases (static token-embedding averages, no BERT layers)."
  config.workdir = f"runs/experiments/promptbert_table3_{model}"
  config.base = "eval_baselines"
  config.rows = tuple(
    {
      "name": name,
      "paper": paper[column],
      "set": {
        "model.path": MODELS[model],
        "method.name": "static_remove_biases" if removed else "static_avg",
        **{f"method.{switch}": switch in removed for switch in SWITCHES if removed},
      },
    }
    for name, removed, paper in ROWS
  )
  return config
