r"""One unsupervised training step: jaxemb's jitted step against a straightforward PyTorch step, same batch.

Two settings, as configs/promptbert.py and configs/simcse.py define them: PromptBERT (two templates, the [MASK]
state, position-offset template denoising with one bias table per template, the training-only dense + tanh MLP,
InfoNCE) and SimCSE (the same sentences twice, dropout the only noise, [CLS], MLP, InfoNCE). The jaxemb step is
built as train.py builds it (jaxemb/training/trainer.py); the PyTorch step runs HF `BertModel` in train mode
through the same encoder calls (each view, then each template's bias rows), clips the gradients as the config does
(`torch.nn.utils.clip_grad_norm_`), then `torch.optim.AdamW` on the same linear schedule. Both start from the same
weights (the MLP too) and read the same rows: the script first checks that their dropout-free losses agree, then
times calls of as many steps as a train.py call runs (config.train.steps_per_call: 4 on the CPU), alternately, with
the jax step once per dropout PRNG (threefry2x32 is jax's default; rbg and unsafe_rbg were 3-8% slower on a 2-core
CPU, docs/benchmarks.md). Each ratio is printed twice: of the two sides' medians, and
the median of each round's ratio (the two sides of a round ran at the machine's speed of that moment).

  python bench/train_step.py                                  # MiniLM, batch 64, 32 sentence tokens
  python bench/train_step.py --model bert-base --repeats 5    # the bert-base-sized random checkpoint
  python bench/train_step.py --dtype bfloat16                 # jaxemb in bfloat16, PyTorch under CPU autocast
  python bench/train_step.py --steps-per-call 1               # one step a call (the CPU's default: 4)
  python bench/train_step.py --prng threefry2x32 --variant "model.scan_unroll=1" --variant "model.scan_unroll=3" \
      --variant "model.remat_policy='full'"                   # the default step against config variants of it

Every jaxemb case prints its first call (compiling included) beside its steps/s, and what one wiki1m epoch at this
batch would take with it (the first call, then the rest at the timed rate): how issue 52 picks a default such as
the layer scan's unroll per backend.
"""

import argparse
import dataclasses
import pathlib
import tempfile

import common
import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
import transformers

from jaxemb import denoise, sharding, sweep, views, xla  # pylint: disable=g-bad-import-order
from jaxemb.training import objectives

PRNG_IMPLS = ("threefry2x32", "rbg", "unsafe_rbg")
WIKI1M = 1_000_000  # Sentences in SimCSE's wiki1m: an unsupervised epoch.


class TorchTrainStep:
  """The jaxemb objective's step written plainly in PyTorch (the settings the two configs use)."""

  def __init__(self, jaxemb_step: common.JaxembTrainStep, config, model_dir: pathlib.Path):
    self.objective = o = jaxemb_step.objective
    # config.model.dtype's counterpart: float32 weights, bfloat16 matmuls and float32 reductions.
    self.autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.model.dtype == "bfloat16")
    if o.loss != "info_nce" or o.head != "mlp" or o.denoise not in ("none", "position_offset"):
      raise ValueError(
        f"its PyTorch side runs InfoNCE, an MLP head and denoising none or position_offset, not loss {o.loss}, head "
        f"{o.head}, denoise {o.denoise} (bench/accelerator.py times every setting against the authors' step)"
      )
    self.bert = transformers.BertModel.from_pretrained(model_dir, add_pooling_layer=False).train()
    mlp = jaxemb_step.initial_params["mlp"]["dense"]
    hidden = self.bert.config.hidden_size
    self.mlp = torch.nn.Linear(hidden, hidden)
    with torch.no_grad():  # The same start as jaxemb's freshly initialised MLP.
      self.mlp.weight.copy_(torch.tensor(np.asarray(mlp["kernel"]).T))
      self.mlp.bias.copy_(torch.tensor(np.asarray(mlp["bias"])))
    tensors = lambda rows: {
      k: torch.tensor(np.asarray(v), dtype=torch.long) for k, v in vars(rows).items() if v is not None
    }
    self.rows = {view: tensors(rows) for view, rows in jaxemb_step.rows.items()}
    offset = views.bias_position_offset(o.bias_positions, jaxemb_step.model_config)
    lengths = jnp.arange(config.data.max_sentence_tokens + 1)
    self.bias_rows = {
      t: tensors(denoise.position_offset_inputs(t, lengths, offset))
      for t in o.view_templates
      if o.denoise == "position_offset"
    }
    t = config.train
    self.params = params = [*self.bert.parameters(), *self.mlp.parameters()]
    self.max_grad_norm = t.max_grad_norm  # Clipped as jaxemb's step clips (0: not at all).
    self.optimizer = torch.optim.AdamW(
      params, lr=t.learning_rate, betas=(t.adam_b1, t.adam_b2), eps=t.adam_eps, weight_decay=t.weight_decay
    )
    self.schedule = torch.optim.lr_scheduler.LinearLR(self.optimizer, 1.0, 0.0, total_iters=common.SCHEDULE_STEPS)

  def _state(self, rows) -> torch.Tensor:
    """The pooled state of each row: [CLS], or the last template [MASK]."""
    out = self.bert(
      input_ids=rows["input_ids"], attention_mask=rows["attention_mask"], position_ids=rows.get("position_ids")
    ).last_hidden_state
    if self.objective.pooling == "cls":
      return out[:, 0]
    return out[torch.arange(len(out)), rows["mask_positions"][:, -1]]

  def loss(self) -> torch.Tensor:
    o, biases, vectors = self.objective, {}, []
    for view, template in zip(o.views, o.view_templates):
      h = self._state(self.rows[view])
      if o.denoise == "position_offset":
        if template not in biases:  # One bias table per template per step, as jaxemb computes it.
          biases[template] = self._state(self.bias_rows[template])
        h = h - biases[template][self.rows[view]["sentence_lengths"]]
      vectors.append(torch.tanh(self.mlp(h)))
    z1, z2 = vectors
    logits = F.cosine_similarity(z1[:, None], z2[None], dim=-1) / o.temperature
    return F.cross_entropy(logits, torch.arange(len(z1)))

  def __call__(self) -> float:
    self.optimizer.zero_grad()
    with self.autocast():
      loss = self.loss()
    loss.backward()
    if self.max_grad_norm:
      torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
    self.optimizer.step()
    self.schedule.step()
    return loss.item()


def dropout_free_losses(jaxemb_step: common.JaxembTrainStep, torch_step: TorchTrainStep) -> tuple[float, float]:
  """Both sides' loss at the initial weights with dropout off: the check that they compute the same step."""
  config = dataclasses.replace(jaxemb_step.model_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  model = jaxemb_step.model.clone(config=config)
  ours, _ = objectives.loss_and_metrics(
    jaxemb_step.objective,
    model,
    jaxemb_step.initial_params,
    jax.tree.map(jnp.asarray, jaxemb_step.rows),
    jax.random.key(0),
  )
  torch_step.bert.eval()
  with torch.no_grad(), torch_step.autocast():
    theirs = torch_step.loss().item()
  torch_step.bert.train()
  return float(ours), theirs


def _arguments() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", default="minilm", help="minilm, bert-base (random, bert-base-sized), or a HF dir")
  parser.add_argument("--configs", default="promptbert,simcse", help="configs/<name>.py, comma-separated")
  parser.add_argument("--batch", type=int, default=64, help="global batch size")
  parser.add_argument("--tokens", type=int, default=32, help="max_sentence_tokens (rows add the template)")
  parser.add_argument("--repeats", type=int, default=3, help="timed steps per side (median); alternating")
  parser.add_argument("--steps-per-call", type=int, help="config.train.steps_per_call (default: the backend's)")
  parser.add_argument("--prng", default=",".join(PRNG_IMPLS), help="jax dropout PRNGs to time")
  parser.add_argument(
    "--variant",
    action="append",
    default=[],
    help="config fields FIELD=VALUE[; FIELD=VALUE] of one more jaxemb step, with the first PRNG (repeatable)",
  )
  parser.add_argument(
    "--dtype",
    default="float32",
    choices=("float32", "bfloat16"),
    help="compute dtype (config.model.dtype; PyTorch's: CPU autocast to bfloat16)",
  )
  return parser.parse_args()


def setting_config(name: str, args: argparse.Namespace, overrides: str = ""):
  """configs/<name>.py at the bench's batch, length, dtype and steps a call, with --variant `overrides`."""
  config = common.train_config(name, args.batch, args.tokens)
  config.model.dtype, config.train.steps_per_call = args.dtype, args.steps_per_call
  sweep.apply_overrides(config, sweep.parse_overrides(overrides), "--variant")
  return config


def jaxemb_steps(name: str, args: argparse.Namespace, model_dir: pathlib.Path, sentences, mesh) -> dict:
  """The jaxemb cases of setting `name`: the config's step once per PRNG, then each --variant with the first PRNG."""
  prngs = args.prng.split(",")
  cases = [*((impl, "", impl) for impl in prngs), *((variant, variant, prngs[0]) for variant in args.variant)]
  return {
    f"jaxemb {label}": common.JaxembTrainStep(setting_config(name, args, overrides), model_dir, sentences, mesh, impl)
    for label, overrides, impl in cases
  }


def time_setting(name: str, steps: dict, torch_step: TorchTrainStep, args: argparse.Namespace):
  """Times calls of the steps a train.py call runs, alternately (jaxemb's compiled loop; PyTorch's one by one),
  after each jaxemb case's first call (its compile); prints a line a case."""
  k = next(iter(steps.values())).steps_per_call
  first_call = {case: common.seconds(step) for case, step in steps.items()}
  cases = {**steps, "pytorch": lambda: [torch_step() for _ in range(k)]}
  rounds = {case: [t / k for t in times] for case, times in common.interleaved_rounds(cases, args.repeats).items()}
  times = common.medians(rounds)
  width = max(map(len, times))
  for case, seconds in times.items():
    epoch = ""
    if case in first_call:  # The first call, then the rest of the epoch's steps at the timed rate.
      hours = (first_call[case] + (WIKI1M // args.batch - k) * seconds) / 3600
      epoch = f"  first call {first_call[case]:6.1f} s, an epoch {hours:6.2f} h"
    print(
      f"{case:<{width}} {seconds * 1e3:8.0f} ms/step {1 / seconds:7.3f} steps/s  "
      f"vs pytorch {common.ratio(1 / seconds, 1 / times['pytorch'])} "
      f"(per round {common.per_round_ratio(rounds[case], rounds['pytorch'])}){epoch}",
      flush=True,
    )


def main():
  args = _arguments()
  kept = xla.keep_step_memory()  # As train.py's run does, before the backend starts; PyTorch shares the process.
  common.print_load("start")
  sentences = common.wiki_sentences(args.batch)
  mesh = sharding.make_mesh(-1, 1)
  with tempfile.TemporaryDirectory() as tmp:
    model_dir = common.model_dir(args.model, pathlib.Path(tmp))
    print(
      f"model {args.model}, batch {args.batch}, {args.tokens} sentence tokens, {args.dtype}, "
      f"jax {jax.__version__}, torch {torch.__version__} ({torch.get_num_threads()} threads); "
      f"step memory kept between calls (xla.keep_step_memory): {'yes' if kept else 'no'}"
    )
    for name in args.configs.split(","):
      steps = jaxemb_steps(name, args, model_dir, sentences, mesh)
      first = next(iter(steps.values()))
      try:
        torch_step = TorchTrainStep(first, setting_config(name, args), model_dir)
      except ValueError as e:
        raise SystemExit(f"bench/train_step.py: configs/{name}.py: {e}") from None
      ours, theirs = dropout_free_losses(first, torch_step)
      widths = sorted({rows.input_ids.shape[1] for rows in first.rows.values()})
      print(
        f"\n== {name}: {len(first.objective.views)} views, row widths {widths}, denoising "
        f"{first.objective.denoise}; steps a call: {first.steps_per_call}; loss without dropout: jaxemb {ours:.5f}, "
        f"pytorch {theirs:.5f}"
      )
      time_setting(name, steps, torch_step, args)
  common.print_load("end")


if __name__ == "__main__":
  main()
