"""Fields shared by every training config; each paper setting (promptbert.py, cotbert.py, ...) sets its own."""

import ml_collections

from configs import eval_common

PROMPTBERT_T1 = 'This sentence of "[X]" means [MASK] .'  # PromptBERT unsupervised, BERT, first view.
PROMPTBERT_T2 = 'This sentence : "[X]" means [MASK] .'  # PromptBERT BERT: second view, and evaluation.
PROMPTROBERTA_T1 = "The sentence : ' [X] ' means [MASK] ."  # PromptBERT unsupervised, RoBERTa, first view.
PROMPTROBERTA_T2 = "This sentence : ' [X] ' means [MASK] ."  # PromptBERT RoBERTa: second view, and evaluation.


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "runs/default"  # Run directory: model/, checkpoints/, best/, metrics.jsonl, tensorboard/.
  config.compilation_cache_dir = "~/.cache/jaxemb/xla"  # Persistent XLA compilation cache ("": none).

  config.model = ml_collections.ConfigDict()
  config.model.path = "bert-base-uncased"  # Hugging Face hub id or local directory to start from.
  config.model.dtype = "float32"  # Compute dtype (bfloat16 on accelerators); params and loss stay float32.
  config.model.remat = False  # Recompute each layer in the backward pass: less activation memory, more compute.

  config.data = ml_collections.ConfigDict()
  config.data.train_file = eval_common.data_path("wiki1m_for_simcse.txt")  # Training corpus ($JAXEMB_DATA/...).
  config.data.format = "text"  # "text": one sentence per line (column "text"); "nli": sent0,sent1,hard_neg CSV.
  config.data.max_sentence_tokens = 32  # Sentences are truncated to this many tokens; templates never are.
  config.data.cache_dir = ""  # Tokenised-corpus cache; "" = <workdir>/cache.

  config.objective = ml_collections.ConfigDict()
  config.objective.columns = ("text", "text")  # The data column each view of the loss reads.
  config.objective.templates = (PROMPTBERT_T1, PROMPTBERT_T2)  # The template of each view ("[X]": none).
  config.objective.pooling = "mask"  # "mask": last template [MASK] state; "cls": the [CLS] state.
  config.objective.denoising = "position_offset"  # Template bias removed in the loss: none, position_offset, pad.
  config.objective.projection = "mlp"  # mlp (fresh dense+tanh, training only), mlm_transform, or none.
  config.objective.loss = "info_nce"  # info_nce, info_nce_with_hard_negatives, or extended_info_nce.
  config.objective.temperature = 0.05  # tau of the cosine logits.
  config.objective.trainable = "all"  # "all", or "prompt": OptiPrompt (encoder frozen).

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 256  # Global batch: in-batch negatives come from every device.
  config.train.learning_rate = 1e-5  # Peak learning rate, decayed linearly to 0.
  config.train.epochs = 1  # Passes over the corpus (the last partial batch of each is dropped).
  config.train.num_steps = 0  # Stop after this many steps instead; 0 = epochs x steps per epoch.
  config.train.seed = 42  # Data order, dropout and head initialisation.
  config.train.weight_decay = 0.0  # AdamW weight decay (HF Trainer default 0).
  config.train.adam_b1 = 0.9  # AdamW beta1.
  config.train.adam_b2 = 0.999  # AdamW beta2.
  config.train.adam_eps = 1e-8  # AdamW epsilon.
  config.train.max_grad_norm = 0.0  # Global-norm gradient clipping; 0 = off, as in the references.
  config.train.eval_every = 125  # Steps between STS-B dev evaluations (the best step is kept in best/).
  config.train.save_every = 125  # Steps between train-state checkpoints (resume restarts from the latest).
  config.train.keep_checkpoints = 2  # Train-state checkpoints kept.
  config.train.log_every = 10  # Steps between metrics.jsonl / TensorBoard records.
  config.train.mesh_data = -1  # Devices on the data axis; -1 = all that fsdp leaves.
  config.train.mesh_fsdp = 1  # Devices each param and optimizer state is split over.
  config.train.distributed = ml_collections.ConfigDict()
  config.train.distributed.coordinator_address = ""  # host:port of process 0; "" = single process.
  config.train.distributed.num_processes = 1  # Processes in the job.
  config.train.distributed.process_id = 0  # This process's index.

  config.eval = ml_collections.ConfigDict()
  config.eval.method = "prompt"  # How a sentence is embedded at evaluation (jaxemb.encode.METHODS).
  config.eval.template = PROMPTBERT_T2  # Evaluation template; "[X]" for non-prompt methods.
  config.eval.denoise = False  # prompt: subtract the position-offset template bias (supervised PromptBERT).
  config.eval.head = "none"  # prompt: none, mlm_transform (--org_mlp) or pooler (--use_pooler), after denoising.
  config.eval.senteval_dir = eval_common.data_path("senteval")  # SentEval data/downstream folder (STS-B dev).
  config.eval.join_tokens = True  # SentEval's files are pre-tokenised: whitespace-split and re-join.
  config.eval.add_period = True  # Append "." to sentences without final punctuation (prompt methods).
  config.eval.batch_size = 128  # Sentences per evaluation encoder call.
  config.eval.length_multiple = 4  # Bucket evaluation rows to a multiple of this many tokens.
  return config
