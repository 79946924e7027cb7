"""jaxemb.mteb: mteb.evaluate scores a jaxemb encoder as jaxemb's own STS scorer does, offline."""

import json
import re
import warnings

import jax
import numpy as np
import pytest

from jaxemb import storage
from jaxemb.data.sts import join_tokens, load_sts_task
from jaxemb.encode import Encoder, Method
from jaxemb.errors import ConfigError
from jaxemb.evaluation import common, sts
from jaxemb.testing.checkpoints import write_random_checkpoint
from tests.support import shared_path

mteb = JaxembModel = None  # pylint: disable=invalid-name  # Imported by _mteb when this file's tests run.


@pytest.fixture(scope="module", autouse=True)
def _mteb():
  """mteb and jaxemb.mteb, imported when this file's tests run rather than when each pytest worker collects it: mteb
  brings polars, pandas and scikit-learn (~4 s of a worker's start on the Zen 3); skips without mteb."""
  global mteb, JaxembModel  # pylint: disable=global-statement
  mteb = pytest.importorskip("mteb")
  from jaxemb.mteb import JaxembModel  # pylint: disable=g-import-not-at-top,redefined-outer-name


PROMPT = Method("prompt", template='This sentence : "[X]" means [MASK] .')
SENTENCES = ["a man is playing a guitar .", "A woman slices an onion", "hello", "the quick brown fox ."]


def _encode(model, batches):
  """model.encode over mteb-style batches ({"text": [...]}), with the keywords mteb's evaluators pass."""
  task = mteb.get_task("STSBenchmark")  # Metadata only: nothing is downloaded.
  return model.encode(
    [{"text": batch} for batch in batches],
    task_metadata=task.metadata,
    hf_split="test",
    hf_subset="default",
    prompt_type=None,
    batch_size=2,
    show_progress_bar=False,
  )


def test_ditto_model_follows_mteb_encoder_protocol(tiny_bert, capsys):
  method = Method("ditto", layer=1, head=2)
  model = JaxembModel(tiny_bert, method=method)
  assert isinstance(model, mteb.models.EncoderProtocol)
  assert model.model.method == method
  vectors = _encode(model, [SENTENCES[:3], SENTENCES[3:]])  # mteb's batches are joined, in order.
  assert capsys.readouterr().err == ""  # mteb's show_progress_bar=False: no progress line.
  # The joined batches are one encode call with mteb's batch_size: the same batches, so the same vectors.
  np.testing.assert_array_equal(vectors, model.model.encode(SENTENCES, batch_size=2))
  unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
  np.testing.assert_allclose(np.asarray(model.similarity(vectors, vectors)), unit @ unit.T, atol=1e-5)
  reverse = vectors[::-1].copy()
  np.testing.assert_allclose(
    np.asarray(model.similarity_pairwise(vectors, reverse)), (unit * unit[::-1]).sum(1), atol=1e-5
  )
  meta = model.mteb_model_meta
  assert (meta.name, meta.embed_dim, meta.framework) == (f"jaxemb/{tiny_bert.name}", 32, ["JAX"])
  assert re.fullmatch(r"weights-[0-9a-f]{12}", meta.revision)
  assert meta.experiment_kwargs == {"method": "ditto", "layer": 1, "head": 2}
  assert meta.n_parameters == sum(np.size(leaf) for leaf in jax.tree.leaves(model.model.params))


def test_every_head_at_once_is_refused_in_one_line(tiny_bert):
  with pytest.raises(ConfigError, match=r"^method 'ditto_all_heads' gives a \[4, 32\] array a sentence; mteb scores"):
    JaxembModel(tiny_bert, method=Method("ditto_all_heads", head=0))


def test_prompt_model_appends_a_period_as_jaxemb_evaluation(tiny_bert):
  model = JaxembModel(tiny_bert, method=PROMPT)
  with_period = [s if s.endswith(".") else s + "." for s in SENTENCES]
  np.testing.assert_array_equal(_encode(model, [SENTENCES]), model.model.encode(with_period, batch_size=2))
  assert "add_period" not in model.mteb_model_meta.experiment_kwargs, "the default is not an experiment"
  plain = JaxembModel(tiny_bert, method=PROMPT, add_period=False)
  plain.model = model.model  # The same encoder, compiled once.
  np.testing.assert_array_equal(_encode(plain, [SENTENCES]), model.model.encode(SENTENCES, batch_size=2))
  assert plain.mteb_model_meta.experiment_kwargs["add_period"] is False


def test_run_directory_model_is_its_best_step(trained_run):
  model = JaxembModel(trained_run)
  # The same weights, method and batches: the same program on the same rows, so the same vectors.
  np.testing.assert_array_equal(
    _encode(model, [SENTENCES]), Encoder.from_pretrained(trained_run).encode(SENTENCES, batch_size=2)
  )
  (step,) = [p.name for p in (trained_run / "best").iterdir() if p.name.isdigit()]
  assert model.mteb_model_meta.revision == f"best-{step}"
  assert model.mteb_model_meta.experiment_kwargs == {"method": "cls_before_pooler"}


def test_run_directory_in_a_bucket_is_named_by_its_folder_with_its_best_step(
  trained_run, bucket, tmp_path, monkeypatch
):
  """A gs:// run directory is neither a hub id nor a local path: "jaxemb/<its folder>", its best step's revision."""
  monkeypatch.setenv(storage.DOWNLOADS_ENV, str(tmp_path / "downloads"))
  storage.upload(trained_run, f"{bucket}/runs/r1")
  model = JaxembModel(f"{bucket}/runs/r1")
  np.testing.assert_array_equal(
    _encode(model, [SENTENCES]), Encoder.from_pretrained(trained_run).encode(SENTENCES, batch_size=2)
  )
  (step,) = [p.name for p in (trained_run / "best").iterdir() if p.name.isdigit()]
  assert (model.mteb_model_meta.name, model.mteb_model_meta.revision) == ("jaxemb/r1", f"best-{step}")


def test_a_checkpoint_rewritten_under_the_same_name_is_scored_again(tmp_path):
  """A plain checkpoint's revision names its weights: mteb keeps the results of other weights under the same folder
  name apart instead of handing back the newest saved ones (what it does, with a warning, for no revision)."""
  first, same, changed = (
    write_random_checkpoint(tmp_path / folder / "model", "bert", seed=seed)
    for folder, seed in (("a", 0), ("b", 0), ("c", 1))
  )
  models = [JaxembModel(path, method="last_avg") for path in (first, same, changed)]
  revisions = [m.mteb_model_meta.revision for m in models]
  assert revisions[0] == revisions[1] != revisions[2], revisions
  task, _ = _local_stsb(20)
  cache = mteb.ResultCache(tmp_path / "mteb")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    scores = [
      mteb.evaluate(m, task, cache=cache, show_progress_bar=False).task_results[0].get_score()
      for m in (models[0], models[2])
    ]
  assert not [w for w in caught if "model_revision" in str(w.message)]
  assert scores[0] != scores[1]
  assert len(list((tmp_path / "mteb").rglob("LocalSTSBenchmark.json"))) == 2


def _local_stsb(pairs: int | None):
  """An mteb STS task over SentEval's STS-B test file (its first `pairs` pairs; None: all), SentEval's tokens
  re-joined as jaxemb's scorer joins them; no hub."""
  from datasets import Dataset, DatasetDict  # pylint: disable=g-import-not-at-top

  task = load_sts_task(shared_path("data", "senteval"), "STSBenchmark")
  (subset,) = task.subsets.values()

  class LocalSTSB(mteb.abstasks.AbsTaskSTS):
    metadata = mteb.TaskMetadata(
      name="LocalSTSBenchmark",
      description="SentEval's STS-B test set, read from ../shared.",
      reference="https://github.com/princeton-nlp/SimCSE",
      dataset={"path": "local", "revision": "local"},
      type="STS",
      category="t2t",
      modalities=["text"],
      eval_splits=["test"],
      eval_langs=["eng-Latn"],
      main_score="cosine_spearman",
      date=("2017-01-01", "2017-12-31"),
      domains=[],
      task_subtypes=[],
      license="cc-by-sa-4.0",
      annotations_creators="human-annotated",
      dialect=[],
      sample_creation="found",
      bibtex_citation="",
    )
    min_score, max_score = 0, 5

    def load_data(self, num_proc=None, **kwargs):
      del num_proc, kwargs
      rows = slice(pairs)
      self.dataset = DatasetDict(
        {
          "test": Dataset.from_dict(
            {
              "sentence1": [join_tokens(s) for s in subset.sentences1[rows]],
              "sentence2": [join_tokens(s) for s in subset.sentences2[rows]],
              "score": subset.scores[rows].tolist(),
            }
          )
        }
      )
      self.data_loaded = True

  cut = sts.StsTask(
    task.name,
    task.split,
    {
      subset.name: sts.StsSubset(
        subset.name, subset.sentences1[slice(pairs)], subset.sentences2[slice(pairs)], subset.scores[slice(pairs)]
      )
    },
  )
  return LocalSTSB(), cut


def _check_main_score_equals_jaxemb(method, pairs, tmp_path, capsys):
  model = JaxembModel(str(shared_path("models", "all-MiniLM-L6-v2")), method=method)
  task, cut = _local_stsb(pairs)
  cache = mteb.ResultCache(tmp_path / "mteb")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result = mteb.evaluate(model, task, cache=cache, encode_kwargs={"batch_size": 64}, show_progress_bar=False)
  # A plain Hugging Face folder has a revision, its weights': mteb warns of a model without one.
  assert not [w for w in caught if "model_revision" in str(w.message)]
  # encode_kwargs without show_progress_bar: each encode call (mteb's STS: sentence1's, sentence2's) is one line on
  # stderr, no terminal here, named by the task and split.
  assert re.findall(r"^LocalSTSBenchmark test: [\d,]+ sentences in \d", capsys.readouterr().err, re.M)
  (task_result,) = result.task_results
  main = task_result.get_score()
  ours = sts.evaluate_sts(model.model.encode, [cut], common.preprocess(True, method.name == "prompt"))
  np.testing.assert_allclose(100 * main, ours["STSBenchmark"].all, atol=1e-4 * 100)
  # mteb saved the result under the model's meta: name, revision, the method's non-default fields.
  (saved,) = (tmp_path / "mteb").rglob("LocalSTSBenchmark.json")
  revision = model.mteb_model_meta.revision
  assert re.fullmatch(r"weights-[0-9a-f]{12}", revision)
  assert f"/jaxemb__all-MiniLM-L6-v2/{revision}/" in saved.as_posix()
  saved_score = json.loads(saved.read_text())["scores"]["test"][0]["main_score"]
  assert saved_score == pytest.approx(main, abs=1e-6)  # mteb rounds what it saves.
  return model


@pytest.mark.parametrize("method", [Method("last_avg"), PROMPT], ids=["last_avg", "prompt"])
def test_main_score_equals_jaxemb_spearman(method, tmp_path, capsys):
  """STS-B test's first 80 pairs (CI: 13-18 s with 200 on the Zen 3, MiniLM's forward compiled as the tests compile);
  the whole set is the slow test below."""
  _check_main_score_equals_jaxemb(method, 80, tmp_path, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("method", [Method("last_avg"), PROMPT], ids=["last_avg", "prompt"])
def test_main_score_equals_jaxemb_spearman_on_all_of_stsb_test(method, tmp_path, capsys):
  _check_main_score_equals_jaxemb(method, None, tmp_path, capsys)
