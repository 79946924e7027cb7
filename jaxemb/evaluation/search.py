"""Searches scored on STS-B dev: PromptBERT's greedy template search (Table 4) and Ditto's layer x head grid.

Both load the model once and rank every candidate by STS-B dev Spearman, as the papers do.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxemb import progress, storage
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method, encoder_options
from jaxemb.errors import ConfigError, DataError
from jaxemb.evaluation import common, run, sts
from jaxemb.models import run_dir
from jaxemb.spec import DittoSearchRun, EvaluationRun, TemplateSearchRun


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One scored candidate: a template, or a Ditto layer/head."""

  stage: str
  name: str
  stsb_dev: float


def relation_template(relation: str) -> str:
  """PromptBERT's first stage: `[X] <relation> [MASK] .` (no relation token: `[X] [MASK] .`)."""
  return " ".join(part for part in ("[X]", relation, "[MASK] .") if part)


def wrapped_template(wrapper: str, relation: str) -> str:
  """The second stage: a prefix wrapping [X] (e.g. `This sentence : "[X]"`) before the chosen relation."""
  if wrapper.count("[X]") != 1:
    raise ConfigError(f"template search wrapper {wrapper!r} must contain [X] exactly once")
  return relation_template(relation).replace("[X]", wrapper, 1)


def greedy_template_search(
  score: Callable[[str], float], relations: Sequence[str], wrappers: Sequence[str]
) -> list[Candidate]:
  """PromptBERT Table 4: the best relation tokens first, then the best prefix around [X] with that relation.

  Returns every candidate scored, in search order; the best is the max of the list.
  """
  scored = [Candidate("relation", relation_template(r), score(relation_template(r))) for r in relations]
  best_relation = relations[int(np.argmax([c.stsb_dev for c in scored]))]
  scored += [Candidate("prefix", t, score(t)) for t in (wrapped_template(w, best_relation) for w in wrappers)]
  return scored


def ditto_head_scores(
  layer_embed: Callable[[int], common.Embed],
  num_layers: int,
  num_heads: int,
  dev: sts_data.StsTask,
  preprocess: common.Preprocess,
  show_progress: bool | None = None,
) -> list[Candidate]:
  """STS-B dev Spearman of every (layer, head), in grid order, the layers done shown on stderr (`progress.track`'s
  `show`).

  `layer_embed(layer)` embeds sentences as [n, heads, hidden] (one encoder pass per layer); every head is then
  scored on its slice of those vectors.
  """
  heads = [(layer, head) for layer in range(num_layers) for head in range(num_heads)]
  with progress.track("layers' heads on STS-B dev", num_layers, "layer", show_progress) as advance:

    def embed_and_count(layer: int) -> common.Embed:
      def embed(sentences):
        vectors = layer_embed(layer)(sentences)
        advance(1)
        return vectors

      return embed

    results = head_sts_results(embed_and_count, heads, [dev], preprocess)
  return [Candidate("grid", f"layer {layer} head {head}", results[layer, head][dev.name].all) for layer, head in heads]


def head_sts_results(
  layer_embed: Callable[[int], common.Embed],
  heads: Sequence[tuple[int, int]],
  tasks: Sequence[sts_data.StsTask],
  preprocess: common.Preprocess,
) -> dict[tuple[int, int], sts.StsResult]:
  """The STS result of each (layer, head) of `heads` on `tasks`: one `layer_embed(layer)` pass per distinct layer
  over the tasks' distinct sentences, each head scored on its slice."""
  sentences = sts.distinct_sentences(tasks, preprocess)
  row = {sentence: i for i, sentence in enumerate(sentences)}
  results = {}
  for layer in dict.fromkeys(layer for layer, _ in heads):
    vectors = layer_embed(layer)(sentences)
    for head in (h for at, h in heads if at == layer):
      embed = lambda batch, h=head: vectors[[row[s] for s in batch], h]
      results[layer, head] = sts.evaluate_sts(embed, tasks, preprocess)
  return results


def run_template_search(config: TemplateSearchRun) -> dict[str, Any]:
  """evaluate.py's `template_search` job: greedy search with the prompt method over config.search's candidates,
  or each template of config.search.templates_file when it is set."""

  def search(model, dev, preprocess):
    base = _named_method(config)
    listed = read_templates(config.search.templates_file) if config.search.templates_file else None
    total = len(listed) if listed else len(config.search.relations) + len(config.search.wrappers)
    with progress.track("templates on STS-B dev", total, "template", config.eval.progress) as advance:

      def score(template: str) -> float:
        encoder = Encoder(
          *model, dataclasses.replace(base, template=template), **encoder_options(config.model, config.eval)
        )
        spearman = _dev_spearman(encoder, dev, preprocess)
        advance(1)
        return spearman

      if listed:
        return [Candidate("listed", t, score(t)) for t in listed]
      return greedy_template_search(score, list(config.search.relations), list(config.search.wrappers))

  return _run_search(config, search)


def read_templates(path: str) -> list[str]:
  """The templates of a JSON file (local or gs://) `{"templates": [{"template": ...}, ...]}` (what the
  generate_templates job writes); DataError naming the file when it is not one."""
  try:
    templates = [entry["template"] for entry in json.loads(storage.path(path).read_text())["templates"]]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f'{path}: not a templates JSON ({{"templates": [{{"template": ...}}]}}): {e}') from None
  if not templates or not all(isinstance(t, str) for t in templates):
    raise DataError(f'{path}: its "templates" must be a non-empty list of {{"template": str}}')
  return templates


def run_ditto_search(config: DittoSearchRun) -> dict[str, Any]:
  """evaluate.py's `ditto_search` job: every layer x head of the model, Ditto's `method.variant`."""

  def search(model, dev, preprocess):
    model_config = model[0]
    return ditto_head_scores(
      ditto_layer_embed(config, model),
      model_config.num_hidden_layers,
      model_config.num_attention_heads,
      dev,
      preprocess,
      config.eval.progress,
    )

  return _run_search(config, search)


def ditto_layer_embed(config: EvaluationRun, model: tuple[Any, Any, Any]) -> Callable[[int], common.Embed]:
  """`layer -> embed`, embed giving Ditto's `method.variant` vectors of every head of `layer`
  ([n, heads, hidden]); `model` is (config, params, tokenizer)."""

  def layer_embed(layer: int) -> common.Embed:
    method = dataclasses.replace(_named_method(config), name="ditto_all_heads", layer=layer, head=0)
    return Encoder(*model, method, **encoder_options(config.model, config.eval)).encode

  return layer_embed


def _dev_spearman(encoder: Encoder, dev: sts_data.StsTask, preprocess: common.Preprocess) -> float:
  return sts.evaluate_sts(encoder.encode, [dev], preprocess)[dev.name].all


def _named_method(config: EvaluationRun) -> Method:
  """config.method, which a search varies: refused in one line when the block names none."""
  if config.method is None:
    raise ConfigError(f"config.method names no method: the {config.job} job varies one (--config.method.name)")
  return config.method


def _run_search(config: DittoSearchRun | TemplateSearchRun, search: Callable[..., list[Candidate]]) -> dict[str, Any]:
  """Loads the model (a Hugging Face checkpoint, or a run directory's best encoder) and STS-B dev once, runs
  `search(model, dev, preprocess)`, prints the ranking."""
  with common.reading_senteval(config.data):
    dev = sts_data.load_sts_task(config.data.senteval_dir, "STSBenchmark", "dev", config.data.source)
  with common.opening_model(config.model):
    source = run_dir.open_source(config.model.path)
    model = (source.config, source.load_params()["encoder"], source.tokenizer)
  start = time.perf_counter()
  scored = search(model, dev, common.preprocess_from_config(config.eval))
  seconds = time.perf_counter() - start
  ranked = sorted(scored, key=lambda c: -c.stsb_dev)
  print(f"{'rank':>4}  {'STS-B dev':>9}  {'stage':<8}  candidate")
  for rank, candidate in enumerate(ranked[: config.search.show], 1):
    print(f"{rank:>4}  {candidate.stsb_dev:9.2f}  {candidate.stage:<8}  {candidate.name}")
  print(f"best: {ranked[0].name} (STS-B dev {ranked[0].stsb_dev:.2f}); {len(scored)} candidates in {seconds:.1f} s")
  summary = {
    "model": config.model.path,
    "job": config.job,
    "best": dataclasses.asdict(ranked[0]),
    "candidates": [dataclasses.asdict(c) for c in scored],
    "seconds": seconds,
  }
  run.write_summary(config, summary)
  return summary
