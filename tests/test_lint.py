"""The formatter and the linter of pyproject.toml's [tool.ruff] pass on the whole repository."""

import importlib.util
import subprocess
import sys

import pytest

from tests.support import REPO

needs_ruff = pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="needs ruff (requirements-test.txt)")


def _ruff(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-m", "ruff", *args, "--no-cache", "."], cwd=REPO, capture_output=True, text=True, check=False
  )


@needs_ruff
def test_the_repository_passes_the_linter():
  result = _ruff("check", "--output-format", "concise")
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


@needs_ruff
def test_the_repository_is_formatted():
  result = _ruff("format", "--check")
  assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout[-3000:] + result.stderr[-2000:]
