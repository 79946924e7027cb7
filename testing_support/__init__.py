"""What the tests (tests/) and the benchmarks (bench/) share that is no part of jaxemb: the repository's paths and
the test oracle. A top-level package of the clone, outside the wheel (pyproject.toml builds `jaxemb*` only), which
no jaxemb module imports (tests/test_layers.py); the tests import it from the repository root (pytest's
`pythonpath`), the benchmarks once bench/common.py has put the root on sys.path.

  shared           REPO, SHARED: this clone, and ../shared beside it or $JAXEMB_SHARED
  reference_torch  the authors' steps (PromptBERT, CoT-BERT, SimCSE) transcribed in PyTorch: the test oracle
"""
