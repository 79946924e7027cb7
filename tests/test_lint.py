"""The linter of pyproject.toml's [tool.ruff] passes on the whole repository."""

import importlib.util
import subprocess
import sys

import pytest

from tests.support import REPO


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="needs ruff (requirements-test.txt)")
def test_the_repository_passes_the_linter():
  result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
