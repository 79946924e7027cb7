"""Fields shared by every training config; each paper setting (promptbert.py, cotbert.py, ...) sets its own.

Each field's type and meaning: jaxemb/spec.py, or `python train.py --config configs/promptbert.py --help`. The
comments here say why a value is the one it is.
"""

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
  config.workdir = "runs/default"
  config.compilation_cache_dir = "~/.cache/jaxemb/xla"

  config.model = ml_collections.ConfigDict()
  config.model.path = "bert-base-uncased"
  config.model.tie_word_embeddings = ml_collections.FieldReference(None, field_type=bool)
  config.model.dtype = "float32"
  config.model.scan_layers = True
  config.model.scan_unroll = ml_collections.FieldReference(None, field_type=int)
  config.model.remat_policy = "none"
  config.model.stack_encoder_calls = ml_collections.FieldReference(None, field_type=bool)
  config.model.loop_small_calls = False

  config.data = ml_collections.ConfigDict()
  config.data.train_file = eval_common.data_path("wiki1m_for_simcse.txt")
  eval_common.add_senteval_fields(config.data)  # SentEval's folder: the evaluators' data.
  config.data.format = "text"
  config.data.max_sentence_tokens = 32
  config.data.tokenization = "alone"
  config.data.cache_dir = ""
  config.data.length_multiple = 8

  config.objective = ml_collections.ConfigDict()
  config.objective.columns = ("text", "text")
  config.objective.templates = (PROMPTBERT_OF, PROMPTBERT_COLON)
  config.objective.pooling = "mask"
  config.objective.denoise = "position_offset"
  config.objective.bias_positions = "from_zero"
  config.objective.head = "mlp"
  config.objective.keep_head = False
  config.objective.loss = "info_nce"
  config.objective.temperature = 0.05
  config.objective.whole_word_mask = False
  config.objective.hard_negative_weight = 0.0
  config.objective.loss_group_size = 0
  config.objective.trainable = "all"
  config.objective.prompt_placement = "last_occurrence"
  config.objective.freeze_padding_rows = True
  config.objective.ddp_world_size = 1

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 256
  config.train.learning_rate = 1e-5
  config.train.epochs = 1
  config.train.num_steps = 0
  config.train.seed = 42
  config.train.optimizer = "hf_adamw"
  config.train.weight_decay = 0.0
  config.train.adam_b1 = 0.9
  config.train.adam_b2 = 0.999
  config.train.adam_eps = 1e-8
  config.train.max_grad_norm = 1.0  # HF Trainer's default, in every reference.
  config.train.save_every = 125
  config.train.keep_checkpoints = 2
  config.train.log_every = 10
  config.train.prefetch = 2
  config.train.steps_per_call = ml_collections.FieldReference(None, field_type=int)
  config.train.lease_seconds = 120.0
  config.train.mesh_data = -1
  config.train.mesh_fsdp = 1
  config.train.distributed = ml_collections.ConfigDict()
  config.train.distributed.coordinator_address = ""
  config.train.distributed.num_processes = 1
  config.train.distributed.process_id = 0

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
  # Model selection, training's alone: the authors' trainer (`sentemb_forward`) embeds STS-B dev.
  config.eval.selection = "training_view"
  config.eval.select_denoise = True  # CoT-BERT passes --mask_embedding_sentence_delta_no_delta_eval: False there.
  config.eval.select_metric = "stsb_dev/STSBenchmark"

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
