"""MLM pre-training from scratch, tied or untied MLM decoder (PromptBERT App. A.2, Table 12, Figure 2): two BERTs
identical but for `tie_word_embeddings`, trained with BERT's masked-LM objective (jaxemb.training.mlm).

  python prepare.py --config configs/pretrain_mlm.py:untied   # writes the architecture directory (no weights)
  python train.py --config configs/pretrain_mlm.py:untied      # initialised from scratch, then MLM

The architecture is a tiny BERT (2 layers, hidden 128, 400 steps at batch 64: about 2 passes over the 11,914-line
wiki sample, minutes on a CPU) on bert-base-uncased's vocabulary; the paper's were
bert-base sized, trained 125k steps at batch 2k. The two kinds differ in `model.tie_word_embeddings` alone; the
params are initialised as HF's `_init_weights` with a key from `train.seed`. Tokens are masked one by one, as HF's
`DataCollatorForLanguageModeling`; `--config.objective.whole_word_mask=True` masks whole words.
"""

import ml_collections

from configs import eval_common, train_common

KINDS = ("tied", "untied")


def get_config(kind: str = "tied"):
  if kind not in KINDS:
    raise ValueError(f"configs/pretrain_mlm.py:{kind}: the argument must be one of {KINDS}")
  config = train_common.get_config()
  config.workdir = f"runs/mlm_{kind}"
  config.model.path = f"models/bert-mlm-{kind}"  # The architecture directory prepare.py writes (no weights).
  # The BERT written to model.path (jaxemb.data.prepare.prepare_architecture; HF's other BertConfig fields keep
  # their defaults, the vocabulary is the tokenizer's).
  config.model.architecture = ml_collections.ConfigDict()
  config.model.architecture.tokenizer = "bert-base-uncased"  # Tokenizer (a local directory or hub id).
  config.model.architecture.hidden_size = 128  # Width of every hidden state and of the word embeddings.
  config.model.architecture.num_hidden_layers = 2  # Transformer layers.
  config.model.architecture.num_attention_heads = 2  # Heads per layer.
  config.model.architecture.intermediate_size = 512  # Feed-forward width.
  config.model.architecture.max_position_embeddings = 128  # Longest input.
  # The one difference of the two runs: untied, the MLM decoder is its own matrix (prepare.py writes the architecture
  # with it; HF's initialisation draws it apart from the word embeddings).
  config.model.tie_word_embeddings = kind == "tied"

  config.data.max_sentence_tokens = 32  # Sentences are cut to this many tokens.
  config.objective.columns = ("text",)
  config.objective.templates = ("[X]",)  # The sentence alone, between [CLS] and [SEP].
  config.objective.loss = "mlm"
  config.objective.pooling = "cls"  # Model selection scores the [CLS] state (cls_before_pooler) on STS-B dev.
  config.objective.denoise = "none"
  config.objective.head = "none"
  config.train.batch_size = 64
  config.train.learning_rate = 1e-3  # Peak, decayed linearly to 0; higher than fine-tuning's, as pre-training is.
  config.train.weight_decay = 0.01  # BERT's.
  config.train.num_steps = 400
  # Evaluated and kept at the last step only, so that the tied and untied models are compared at the same step.
  config.evals.stsb_dev.every = config.train.get_ref("num_steps")
  config.train.save_every = 100
  config.method = eval_common.method_config("static_avg")  # Table 12's measure.
  return config
