"""Fields shared by every training config; each paper setting (promptbert.py, cotbert.py, ...) sets its own."""

import ml_collections

from configs import eval_common

# The templates of kongds/Prompt-BERT `run.sh`, written as its `*cls*_..._*sep+*` strings read ("_" a space; no space
# before [MASK]: `means<mask>.` gives RoBERTa `<mask>` then `.`, not `Ġ.`).
PROMPTBERT_OF = 'This sentence of "[X]" means[MASK].'  # unsup-bert view 1 (and its evaluation), sup-bert.
PROMPTBERT_COLON = 'This sentence : "[X]" means[MASK].'  # unsup-bert view 2; the untrained prompt, OptiPrompt.
PROMPTROBERTA_THIS = "This sentence : ' [X] ' means[MASK]."  # unsup-roberta view 1 (and its evaluation), sup-roberta.
PROMPTROBERTA_THE = "The sentence : ' [X] ' means[MASK]."  # unsup-roberta view 2.


def get_config():
  config = ml_collections.ConfigDict()
  config.workdir = "runs/default"  # Run directory: model/, checkpoints/, best/, metrics.jsonl, tensorboard/.
  config.compilation_cache_dir = "~/.cache/jaxemb/xla"  # Persistent XLA compilation cache ("": none).

  config.model = ml_collections.ConfigDict()
  config.model.path = "bert-base-uncased"  # Hugging Face hub id or local directory to start from.
  # The MLM decoder: False gives it its own [vocab, hidden] matrix (HF `cls.predictions.decoder.weight`; a tied
  # checkpoint's is initialised as a copy of its word embeddings), True ties it to the word embeddings (refused for
  # an untied checkpoint: its decoder would be dropped). None: as the checkpoint (or architecture) has it.
  config.model.tie_word_embeddings = ml_collections.FieldReference(None, field_type=bool)
  config.model.dtype = "float32"  # Compute dtype (bfloat16 on accelerators); params and loss stay float32.
  # Run the layers as one nn.scan over params stacked on a leading axis (`layers/...`, maxtext's pattern): XLA
  # compiles one layer instead of every one (bench/scan_layers.py). False: a module per layer (`layer_{i}/...`).
  # Checkpoints written for Hugging Face and a run's best step read back per layer either way.
  config.model.scan_layers = True
  # Layers run per trip of the scan's loop (nn.scan's unroll; the same params, dropout and outputs, compiled
  # differently). None: per backend (jaxemb.xla.scan_unroll): every layer on the CPU, where the loop cost a tenth of
  # a step, unless the layers remat (unrolled whole they saved no memory); 1 elsewhere (one layer compiled). 1 also
  # compiles faster on the CPU (tests at toy scale set it).
  config.model.scan_unroll = ml_collections.FieldReference(None, field_type=int)
  # What each layer keeps for the backward pass: "none" (everything), "full" (nothing: recomputed, about one more
  # forward pass of compute for less activation memory), or a jax.checkpoint_policies name such as "dots_saveable"
  # (keep the matmul outputs): jaxemb.models.bert.REMAT_POLICIES.
  config.model.remat_policy = "none"
  # Run a step's encoder passes of near shapes (the views, the bias tables; jaxemb.training.encoder_calls) as one call,
  # each with its own dropout masks. None: per backend (jaxemb.xla.stacks_encoder_calls): yes on accelerators, no on
  # the CPU, where it was slower. True also compiles CoT-BERT's step faster (tests at toy scale set it).
  config.model.stack_encoder_calls = ml_collections.FieldReference(None, field_type=bool)

  config.data = ml_collections.ConfigDict()
  config.data.train_file = eval_common.data_path("wiki1m_for_simcse.txt")  # Training corpus ($JAXEMB_DATA/...).
  eval_common.add_senteval_fields(config.data)  # SentEval's folder: the evaluators' data.
  config.data.format = "text"  # "text": one sentence per line (column "text"); "nli": sent0,sent1,hard_neg CSV.
  config.data.max_sentence_tokens = 32  # Sentences are truncated to this many tokens; templates never are.
  # How training rows are built (templates.TOKENIZATIONS): "alone", the template ids around the sentence's own
  # tokens, as the authors' `train.py` `prepare_features` (RoBERTa: no leading space on the sentence's first word);
  # "in_context", the filled-in string tokenised at once.
  config.data.tokenization = "alone"
  config.data.cache_dir = ""  # Tokenised-corpus cache; "" = <workdir>/cache.
  # Each global batch (and its template-bias rows) is padded to its longest row rounded up to a multiple of this:
  # no step runs on 32 sentence tokens when its longest has 20, and at most 1 + 32 / 8 shapes compile. 0 = every
  # batch at the template's width + max_sentence_tokens.
  config.data.length_multiple = 8

  config.objective = ml_collections.ConfigDict()
  config.objective.columns = ("text", "text")  # The data column each view of the loss reads.
  config.objective.templates = (PROMPTBERT_OF, PROMPTBERT_COLON)  # The template of each view ("[X]": none).
  config.objective.pooling = "mask"  # "mask": last template [MASK] state; "cls": the [CLS] state.
  config.objective.denoise = "position_offset"  # Template bias removed in the loss: none, position_offset, pad.
  # Position-offset rows' positions: "from_zero" (the authors pass arange(L), RoBERTa included) or "model" (HF's).
  config.objective.bias_positions = "from_zero"
  # The projection each view goes through before the loss: mlp (fresh dense+tanh), mlm_transform (the MLM head's), or
  # none.
  config.objective.head = "mlp"
  # Keep the head for model selection and evaluation (the authors' --mlp_only_train off): a trained MLP
  # becomes the checkpoint's pooler, as run.sh and SimCSE's simcse_to_huggingface.py rename mlp -> pooler.
  config.objective.keep_head = False
  config.objective.loss = "info_nce"  # info_nce, info_nce_with_hard_negatives, extended_info_nce, or mlm.
  config.objective.temperature = 0.05  # tau of the cosine logits.
  # loss "mlm": select whole words (all the WordPiece / byte-level pieces of a word together, jaxemb.training.mlm);
  # False: each token on its own, as HF's DataCollatorForLanguageModeling.
  config.objective.whole_word_mask = False
  # info_nce_with_hard_negatives: SimCSE's --hard_negative_weight, log of the weight on each row's own hard negative
  # (0: all terms weigh 1, as every published run).
  config.objective.hard_negative_weight = 0.0
  config.objective.loss_group_size = 0  # Rows per loss, losses averaged (CoT-BERT's 2 GPUs x 128); 0 = global batch.
  config.objective.trainable = "all"  # "all", or "prompt": OptiPrompt (encoder frozen).
  # OptiPrompt's vectors go to the last occurrence of each template token id (the authors'), or "template".
  config.objective.prompt_placement = "last_occurrence"
  config.objective.freeze_padding_rows = True  # The [PAD] embedding rows HF's padding_idx never updates stay fixed.
  # The authors' DDP processes (supervised runs: 4): each back-propagates the global loss through its own rows only
  # and DDP averages, so the gradient is the global loss's / ddp_world_size (before clipping). 1 = the plain one.
  config.objective.ddp_world_size = 1

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 256  # Global batch: in-batch negatives come from every device.
  config.train.learning_rate = 1e-5  # Peak learning rate, decayed linearly to 0.
  config.train.epochs = 1  # Passes over the corpus (the last partial batch of each is dropped).
  config.train.num_steps = 0  # Stop after this many steps instead; 0 = epochs x steps per epoch.
  config.train.seed = 42  # Data order, dropout and head initialisation.
  config.train.optimizer = "hf_adamw"  # "hf_adamw": transformers 4.2's AdamW (the authors'); "optax_adamw".
  config.train.weight_decay = 0.0  # AdamW weight decay (HF Trainer default 0).
  config.train.adam_b1 = 0.9  # AdamW beta1.
  config.train.adam_b2 = 0.999  # AdamW beta2.
  config.train.adam_eps = 1e-8  # AdamW epsilon.
  config.train.max_grad_norm = 1.0  # Global-norm gradient clipping (HF Trainer's default, every reference); 0 = off.
  config.train.save_every = 125  # Steps between train-state checkpoints (resume restarts from the latest).
  config.train.keep_checkpoints = 2  # Train-state checkpoints kept.
  config.train.log_every = 10  # Steps between metrics.jsonl / TensorBoard records.
  config.train.prefetch = 2  # Batches gathered and sent to the devices while a step runs; 0 = none.
  # Optimizer steps per call of the jitted steps (one compiled loop; the same steps and bits whatever the split).
  # None: per backend (jaxemb.xla.steps_per_call): 4 on the CPU, where each call maps and faults in the step's
  # temporaries afresh; 1 elsewhere. A call ends early at an evaluation, a save, the last step or a batch of
  # another width; a SIGTERM is answered once the call ends.
  config.train.steps_per_call = ml_collections.FieldReference(None, field_type=int)
  # A run directory in a bucket is held by a lease of this many seconds (jaxemb/training/lease.py): a process that
  # cannot renew it for 5/6 of it (a network outage, a stalled VM) stops, writing nothing more, and another process
  # may take the run over once it is 7/6 old. Longer rides out longer outages and makes a takeover wait longer.
  config.train.lease_seconds = 120.0
  config.train.mesh_data = -1  # Devices on the data axis; -1 = all that fsdp leaves.
  config.train.mesh_fsdp = 1  # Devices each param and optimizer state is split over.
  # Multi-host: with coordinator_address "", the job of the cluster jax.distributed.initialize() detects (a TPU pod
  # slice, a SLURM job step, an Open MPI launch: the same command on every host), else a single process.
  config.train.distributed = ml_collections.ConfigDict()
  config.train.distributed.coordinator_address = ""  # host:port of process 0; "" = the detected cluster, if any.
  config.train.distributed.num_processes = 1  # Processes in the job, with coordinator_address.
  config.train.distributed.process_id = 0  # This process's index, with coordinator_address.

  # The run's evaluation method, recorded in its run directory (evaluate.py, Encoder.from_pretrained(workdir)): the
  # authors' evaluation.py flags in run.sh. The same block as the evaluation configs' (eval_common.method_config):
  # name "prompt" with view 1's template, in context; denoise and head (none, mlm_transform for --org_mlp, pooler for
  # --use_pooler) for the supervised runs. Its position-offset rows and continuous-template placement are the
  # objective's.
  config.method = eval_common.method_config("prompt")
  config.method.template = PROMPTBERT_OF
  config.method.bias_positions = config.objective.get_ref("bias_positions")
  config.method.prompt_placement = config.objective.get_ref("prompt_placement")

  # The evaluation block of every config (eval_common.eval_config): what sweep.py's scoring of the trained run and
  # evaluate.py on the run directory read, and the encoder batches of the evaluators below.
  config.eval = eval_common.eval_config()
  config.eval.add_period = True  # evaluation.py appends "." to sentences without final punctuation.
  # Model selection, training's alone and kept here: the evaluators embed with the selection method, and the step
  # whose select_metric is highest is kept in best/. "training_view" is the authors' trainer (`sentemb_forward`):
  # view 1's template around the sentence's own tokens, no ".", the objective's position-offset bias if
  # select_denoise, the head if kept. "eval_method": the evaluation method above, with eval's sentence rules.
  config.eval.selection = "training_view"
  config.eval.select_denoise = True  # CoT-BERT passes --mask_embedding_sentence_delta_no_delta_eval: False there.
  config.eval.select_metric = "stsb_dev/STSBenchmark"  # A logged evaluator key, <evaluator>/<metric>.

  # The evaluators (jaxemb/evaluation/evaluators/), by name: each scores the training params every `every` steps
  # and at the last one, logged as <name>/<metric> to metrics.jsonl and TensorBoard. Each entry gives its type and
  # period; its type's other fields (sts: tasks, split; transfer: tasks, mode; align_uniform: threshold) are added at
  # their defaults by the commands. Add one in a config with, e.g., config.evals.sts_test =
  # ml_collections.ConfigDict({"type": "sts", "every": 1000, "tasks": eval_common.STS_TASKS, "split": "test"}), or on
  # the command line: --config.evals.sts_test.type=sts --config.evals.sts_test.every=1000
  # --config.evals.sts_test.split=test.
  config.evals = ml_collections.ConfigDict()
  config.evals.stsb_dev = ml_collections.ConfigDict({"type": "sts", "every": 125})  # STS-B dev, the selection metric.
  return config
