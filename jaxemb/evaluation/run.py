"""Evaluation jobs from an `ml_collections` config (configs/eval_*.py): what evaluate.py runs."""

from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Any

import jax.numpy as jnp

from jaxemb import bias_removal, tfidf
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method
from jaxemb.evaluation import sts
from jaxemb.models import load_tokenizer

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


def method_from_config(config: Any) -> Method:
  m = config.method
  bias_filter = bias_removal.BiasFilter(remove_frequent=m.remove_frequent, remove_subwords=m.remove_subwords,
                                        lowercase=m.lowercase, remove_punctuation=m.remove_punctuation)
  return Method(name=m.name, template=m.template, top_k=m.top_k, ditto_layer=m.ditto_layer,
                ditto_head=m.ditto_head, ditto_variant=m.ditto_variant, idf_path=m.idf_path or None,
                bias_filter=bias_filter, denoise=m.denoise, head=m.head, tokenization=m.tokenization,
                bias_positions=m.bias_positions, prompt_placement=m.prompt_placement)


def encoder_from_config(config: Any, method: Method | None = None) -> Encoder:
  if config.model.dtype not in DTYPES:
    raise ValueError(f"model.dtype {config.model.dtype!r} is not one of {sorted(DTYPES)}")
  return Encoder.from_pretrained(
      config.model.path, method or method_from_config(config), dtype=DTYPES[config.model.dtype],
      max_sentence_tokens=config.eval.max_sentence_tokens or None, length_multiple=config.eval.length_multiple)


def preprocess(join_tokens: bool, add_period: bool) -> sts.Preprocess:
  """SentEval's whitespace re-join of its pre-tokenised files, and evaluation.py's "." for prompt methods."""
  def apply(sentence: str) -> str:
    sentence = sts_data.join_tokens(sentence) if join_tokens else sentence
    return sts_data.add_period(sentence) if add_period else sentence
  return apply


def preprocess_from_config(config: Any) -> sts.Preprocess:
  """The test-time sentence rules the config turns on."""
  return preprocess(config.eval.join_tokens, config.eval.add_period)


def load_tasks(config: Any) -> tuple[list[sts_data.StsTask], sts_data.StsTask]:
  """(the configured test tasks, STS-B dev)."""
  names = [name.strip() for name in config.eval.tasks.split(",") if name.strip()]
  unknown = [name for name in names if name not in sts_data.TASKS]
  if unknown:
    raise ValueError(f"eval.tasks: unknown tasks {unknown}; known: {list(sts_data.TASKS)}")
  root, source = config.data.senteval_dir, config.data.source
  tasks = [sts_data.load_sts_task(root, name, "test", source) for name in names]
  return tasks, sts_data.load_sts_task(root, "STSBenchmark", "dev", source)


def run_sts(config: Any) -> dict[str, Any]:
  """Encodes every distinct sentence of the STS tasks once, scores them, prints the table, returns the numbers."""
  tasks, dev = load_tasks(config)  # Data errors surface before the model is loaded.
  encoder = encoder_from_config(config)
  preprocess = preprocess_from_config(config)
  embed = lambda sentences: encoder.encode(sentences, batch_size=config.eval.batch_size)
  start = time.perf_counter()
  result = sts.evaluate_sts(embed, tasks, preprocess)
  dev_spearman = sts.evaluate_sts(embed, [dev], preprocess)["STSBenchmark"].all
  seconds = time.perf_counter() - start
  summary = {**result.to_dict(), "stsb_dev": dev_spearman, "method": config.method.to_dict(),
             "model": config.model.path, "seconds": seconds, "compilations": encoder.compilations}
  print(result.table())
  print(f"STS-B dev: {dev_spearman:.2f}")
  print(f"{config.method.name} on {config.model.path}: {seconds:.1f} s, {encoder.compilations} compiled shapes")
  write_summary(config, summary)
  return summary


def run_fit_idf(config: Any) -> dict[str, Any]:
  """evaluate.py's `fit_idf` job: the IDF table of config.idf.corpus with model.path's tokenizer, written to
  config.idf.output for method tfidf_first_last (`method.idf_path`) and the ditto_analysis job."""
  if not config.idf.output:
    raise ValueError("idf.output is empty: name the JSON file to write the IDF table to")
  sentences = tfidf.corpus_sentences(config.idf.corpus)  # A missing corpus fails before the tokenizer loads.
  start = time.perf_counter()
  idf = tfidf.fit_idf(sentences, load_tokenizer(config.model.path), config.idf.chunk_size)
  tfidf.save_idf(config.idf.output, idf)
  summary = {"corpus": config.idf.corpus, "output": config.idf.output, "model": config.model.path,
             "token_ids": len(idf), "seconds": time.perf_counter() - start}
  print(f"{len(idf)} token ids from {config.idf.corpus} -> {config.idf.output} ({summary['seconds']:.1f} s)")
  return summary


def write_summary(config: Any, summary: dict[str, Any]):
  """Writes a job's results as JSON to config.eval.output_json, when it is set."""
  if config.eval.output_json:
    path = pathlib.Path(config.eval.output_json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    logging.info("wrote %s", path)
