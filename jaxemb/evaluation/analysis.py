"""Analyses of an embedding space: what PromptBERT and CoT-BERT report besides STS scores.

sentence_anisotropy             PromptBERT Eq. 1: mean cosine between distinct sentences of a sample
token_embedding_average_cosine  PromptBERT Table 2: the same over the static word-embedding rows
alignment, uniformity           CoT-BERT Eq. 4-5 (Wang & Isola), on STS-B test as SimCSE measures them
mask_top_tokens                 PromptBERT Table 7: the MLM head's top tokens at [MASK], with and without
                                template denoising
cosine_gold_scatter             CoT-BERT Fig. 3: predicted cosine against gold score on STS-B test
run_analysis                    all of the above from a config (configs/eval_analysis.py)
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import sys
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxemb import atomic, storage, templates
from jaxemb.data import sts as sts_data
from jaxemb.encode import Encoder, Method
from jaxemb.errors import ConfigError
from jaxemb.evaluation import common, correlation, run, sts
from jaxemb.models import EncoderConfig, Transformer
from jaxemb.spec import AnalysisRun


def _unit_rows(x: np.ndarray) -> np.ndarray:
  """Rows scaled to unit length in float64; a zero row stays zero (its cosines count as 0, as in SentEval)."""
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _mean_cosine_between_distinct_rows(x: np.ndarray) -> float:
  """Mean of cos(x_i, x_j) over ordered pairs i != j, exactly and in O(n d).

  The sum over all pairs of unit vectors is |sum_i u_i|^2; the diagonal adds sum_i |u_i|^2 to it.
  """
  units = _unit_rows(x)
  n = len(units)
  if n < 2:
    raise ValueError(f"need at least 2 vectors for a pairwise mean, got {n}")
  total = units.sum(0)
  return float((total @ total - np.einsum("ij,ij->", units, units)) / (n * (n - 1)))


def sentence_anisotropy(vectors: np.ndarray) -> float:
  """PromptBERT Eq. 1: the mean cosine between the embeddings of distinct sentences ([n, d] -> scalar).

  Signed, as in kongds/Prompt-BERT's `cal_avg_cosine` (Eq. 1 prints an absolute value; the two agree whenever
  the mean is positive). That code also averages in each sentence's cosine with itself, a 1/n difference.
  """
  return _mean_cosine_between_distinct_rows(vectors)


def token_embedding_average_cosine(word_embeddings: np.ndarray) -> float:
  """PromptBERT Table 2: the mean cosine between every two distinct rows of the static word embeddings."""
  return _mean_cosine_between_distinct_rows(word_embeddings)


def alignment(x: np.ndarray, y: np.ndarray, alpha: float = 2) -> float:
  """CoT-BERT Eq. 4: mean |f(x) - f(y)|^alpha over positive pairs (rows of x and y), on unit vectors."""
  distances = np.linalg.norm(_unit_rows(x) - _unit_rows(y), axis=-1)
  return float(np.mean(distances**alpha))


def uniformity(x: np.ndarray, t: float = 2) -> float:
  """CoT-BERT Eq. 5: log of the mean exp(-t |f(x) - f(y)|^2) over pairs of distinct rows, on unit vectors.

  Exact over all n^2 pairs at once (n^2 memory): sized for STS-B test's 2,758 sentences.
  """
  units = _unit_rows(x)
  n = len(units)
  if n < 2:
    raise ValueError(f"need at least 2 vectors for uniformity, got {n}")
  squared_norms = np.einsum("ij,ij->i", units, units)
  squared = np.maximum(squared_norms[:, None] + squared_norms[None, :] - 2 * units @ units.T, 0)
  kernel = np.exp(-t * squared)
  np.fill_diagonal(kernel, 0)  # Only pairs of distinct rows, as torch.pdist gives them.
  return float(np.log(kernel.sum() / (n * (n - 1))))


def pair_alignment_uniformity(
  first: np.ndarray, second: np.ndarray, gold: np.ndarray, threshold: float = 4.0, inclusive: bool = False
) -> dict[str, Any]:
  """Alignment over the pairs whose gold score is above `threshold` (at or above it when `inclusive`), and
  uniformity over every sentence of both sides, as SimCSE and CoT-BERT Table 5 measure them on STS-B."""
  gold = np.asarray(gold)
  positive = gold >= threshold if inclusive else gold > threshold
  rule = f"gold {'>=' if inclusive else '>'} {threshold}"
  if not positive.any():
    raise ValueError(f"no pair has {rule}")
  return {
    "alignment": alignment(first[positive], second[positive]),
    "uniformity": uniformity(np.concatenate([first, second])),
    "positive_pairs": int(positive.sum()),
    "positive_rule": rule,
    "pairs": len(gold),
  }


def stsb_pair_vectors(
  encoder: Encoder, pairs: sts_data.StsSubset, preprocess: common.Preprocess = sts_data.join_tokens
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(first vectors, second vectors, gold scores) of `pairs` (STS-B test's), encoded in one call."""
  vectors = encoder.encode([preprocess(s) for s in pairs.sentences1 + pairs.sentences2])
  return vectors[: len(pairs)], vectors[len(pairs) :], pairs.scores


@dataclasses.dataclass(frozen=True)
class MaskTopTokens:
  """The MLM head's top tokens at a sentence's [MASK], best first."""

  sentence: str
  tokens: tuple[str, ...]  # From h[MASK] as is.
  denoised: tuple[str, ...]  # From h[MASK] minus the template bias for the sentence's length.


@functools.partial(jax.jit, static_argnames=("config", "template", "k"))
def _mask_top_ids(
  params: Any, batch: templates.TemplateBatch, config: EncoderConfig, template: templates.Template, k: int
) -> jax.Array:
  """[2, batch, k] token ids at the last [MASK]: row 0 from h, row 1 from h minus the template bias.

  h and h - bias are the `prompt` method's vectors without and with `denoise` (kongds/Prompt-BERT's position-offset
  bias, subtracted before the MLM head): the path evaluation and training take.
  """
  model = Transformer(config)
  vectors = [
    Method("prompt", template=template.text, denoise=denoise).vectors(model, params, batch, template=template)
    for denoise in ("none", "position_offset")
  ]
  logits = model.apply({"params": params}, jnp.stack(vectors), method=Transformer.mlm_logits)
  return jax.lax.top_k(logits, k)[1]


def mask_top_tokens(
  config: EncoderConfig,
  params: Any,
  tokenizer: templates.Tokenizer,
  template: str,
  sentences: Sequence[str],
  k: int = 5,
) -> list[MaskTopTokens]:
  """PromptBERT Table 7: the k tokens the MLM head ranks highest at the template's (last) [MASK] per sentence,
  without and with position-offset template denoising. Needs params with an `mlm_head`."""
  if "mlm_head" not in params:
    raise ConfigError(
      "mask_top_tokens needs a checkpoint with an MLM head (a *ForMaskedLM checkpoint); these params have none"
    )
  parsed = templates.Template.parse(template, tokenizer)
  if parsed.num_masks == 0:
    raise ConfigError(f"template {template!r} has no [MASK]")
  batch = templates.tokenize_sentences(parsed, tokenizer, sentences, max_length=config.max_length)
  ids = np.asarray(_mask_top_ids(params, batch, config, parsed, k))
  return [
    MaskTopTokens(
      sentence,
      tuple(tokenizer.convert_ids_to_tokens(raw.tolist())),
      tuple(tokenizer.convert_ids_to_tokens(denoised.tolist())),
    )
    for sentence, raw, denoised in zip(sentences, ids[0], ids[1])
  ]


def cosine_gold_scatter(
  predicted: np.ndarray, gold: np.ndarray, path: storage.PathLike, title: str = "", normalize: bool = False
) -> storage.Path:
  """CoT-BERT Fig. 3: a PNG scatter of predicted cosine (y) against gold score (x), written whole to `path` (local
  or gs://); `normalize` min-max scales the cosines to [0, 1] as the figure does."""
  try:
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
    from matplotlib.backends import backend_agg  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("cosine_gold_scatter needs matplotlib: pip install matplotlib") from e
  predicted = np.asarray(predicted, np.float64)
  if normalize:
    predicted = (predicted - predicted.min()) / max(np.ptp(predicted), 1e-12)
  # A Figure on its own Agg canvas: no pyplot, so the caller's global backend and figures are untouched.
  fig = figure.Figure(figsize=(5, 4), dpi=120)
  backend_agg.FigureCanvasAgg(fig)
  ax = fig.add_subplot()
  ax.scatter(gold, predicted, s=6, alpha=0.4, linewidths=0)
  ax.set_xlabel("gold score")
  ax.set_ylabel("predicted cosine" + (" (min-max normalised)" if normalize else ""))
  ax.set_title(title)
  fig.tight_layout()
  path = storage.path(path)
  atomic.write(path, lambda f: fig.savefig(f, format="png"))
  return path


SAMPLE_ORDERS = ("first", "random")


def read_sample(
  path: str | pathlib.Path,
  size: int,
  max_words: int = 0,
  lowercase: bool = False,
  order: str = "first",
  seed: int = 0,
  *,
  field: str,
) -> list[str]:
  """`size` non-empty lines of a text file: the first ones (order "first"), as kongds/Prompt-BERT's code samples
  wiki1m for anisotropy (it lowercases them and keeps the first 32 words), or `size` drawn uniformly without
  replacement with `seed`, kept in file order (order "random": the papers' "randomly sampled" sentences).
  `max_words` 0 keeps every word. `field`, the config field naming the file, is what an error names."""
  if order not in SAMPLE_ORDERS:
    raise ConfigError(f"sample order {order!r} is not one of {SAMPLE_ORDERS}")
  path = pathlib.Path(path)
  if not path.is_file():
    raise sts_data.DataError(
      f"{field}={path}: no such file; point it at a text file, one sentence per line (e.g. the wiki1m sample)"
    )
  sample = []
  with path.open(encoding="utf-8") as lines:
    for line in lines:
      words = (line.lower() if lowercase else line).split()
      if words:
        sample.append(" ".join(words[: max_words or None]))
        if order == "first" and len(sample) == size:
          break
  if order == "random" and len(sample) > size:
    chosen = np.sort(np.random.default_rng(seed).choice(len(sample), size, replace=False))
    sample = [sample[i] for i in chosen]
  if len(sample) < 2:
    raise sts_data.DataError(f"{field}={path}: {len(sample)} non-empty lines; anisotropy needs at least 2")
  if len(sample) < size:  # A number over fewer sentences than the paper's is not quite the paper's.
    print(f"note: {path} has {len(sample)} non-empty lines, fewer than the {size} asked: all are used", file=sys.stderr)
  return sample


def run_analysis(config: AnalysisRun) -> dict[str, Any]:
  """Computes every analysis for the configured model and method, prints them, returns (and optionally writes)
  them as a dict."""
  a = config.analysis
  # Data errors surface before the model is loaded.
  sample = read_sample(
    a.sample_file,
    a.sample_size,
    a.sample_max_words,
    a.sample_lowercase,
    a.sample_order,
    a.sample_seed,
    field="analysis.sample_file",
  )
  with common.reading_senteval(config.data):
    stsb_test = sts_data.load_sts_task(config.data.senteval_dir, "STSBenchmark", "test", config.data.source)
  (pairs,) = stsb_test.subsets.values()
  start = time.perf_counter()
  encoder = run.encoder_from_config(config)
  preprocess = common.preprocess_from_config(config.eval)
  first, second, gold = stsb_pair_vectors(encoder, pairs, preprocess)
  predicted = sts.cosine(first, second)
  summary = {
    "model": config.model.path,
    "method": encoder.method.to_block(),
    "anisotropy": sentence_anisotropy(encoder.encode([preprocess(s) for s in sample])),
    "anisotropy_sentences": len(sample),
    "token_embedding_average_cosine": token_embedding_average_cosine(encoder.params["embeddings"]["word"]["embedding"]),
    "stsb_test": {
      **pair_alignment_uniformity(first, second, gold, a.positive_threshold, a.positive_inclusive),
      "spearman": 100 * float(correlation.spearman(predicted, gold)),
    },
    "mask_top_tokens": _top_tokens_if_possible(encoder, [preprocess(s) for s in a.top_k_sentences], a.top_k),
    "scatter_png": "",
  }
  if a.scatter_png:
    title = f"{pathlib.Path(config.model.path).name} {config.method.name} (STS-B test)"
    summary["scatter_png"] = str(cosine_gold_scatter(predicted, gold, a.scatter_png, title, a.scatter_normalize))
  summary["seconds"] = time.perf_counter() - start
  print(_report(summary))
  run.write_summary(config, summary)
  return summary


def _top_tokens_if_possible(encoder: Encoder, sentences: list[str], k: int) -> list[dict[str, Any]] | None:
  """Table 7 rows as dicts, or None (said on stderr) when the method has no [MASK] or the model no MLM head."""
  if not sentences:
    return None
  if encoder.template.num_masks == 0 or "mlm_head" not in encoder.params:
    print(
      "note: [MASK] top tokens skipped: they need a prompt method and a checkpoint with an MLM head", file=sys.stderr
    )
    return None
  rows = mask_top_tokens(encoder.config, encoder.params, encoder.tokenizer, encoder.method.template, sentences, k)
  return [dataclasses.asdict(row) for row in rows]


def _report(summary: dict[str, Any]) -> str:
  """The summary as a few readable lines."""
  stsb = summary["stsb_test"]
  lines = [
    f"{summary['method']['name']} on {summary['model']} ({summary['seconds']:.1f} s)",
    f"  sentence anisotropy ({summary['anisotropy_sentences']} sentences): {summary['anisotropy']:.4f}",
    f"  static token-embedding average cosine: {summary['token_embedding_average_cosine']:.4f}",
    f"  STS-B test: alignment {stsb['alignment']:.4f} ({stsb['positive_pairs']} pairs with "
    f"{stsb['positive_rule']}), uniformity {stsb['uniformity']:.4f} "
    f"({2 * stsb['pairs']} sentences), Spearman {stsb['spearman']:.2f}",
  ]
  for row in summary["mask_top_tokens"] or ():
    lines.append(
      f"  [MASK] top tokens for {row['sentence']!r}: {', '.join(row['tokens'])} | "
      f"denoised: {', '.join(row['denoised'])}"
    )
  if summary["scatter_png"]:
    lines.append(f"  cosine vs gold scatter: {summary['scatter_png']}")
  return "\n".join(lines)
