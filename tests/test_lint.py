"""The formatter and the linter of pyproject.toml's [tool.ruff] pass on the whole repository."""

import ast
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


MAX_FUNCTION_LINES = 60
CODE_FOLDERS = ("jaxemb", "testing_support", "bench", "tests")


def test_no_function_runs_past_sixty_lines():
  """A function longer than a screen hides its steps; config files' `get_config` is a declaration, not a function."""
  long = []
  code = [*REPO.glob("*.py"), *(path for folder in CODE_FOLDERS for path in (REPO / folder).glob("**/*.py"))]
  for path in sorted(code):
    relative = path.relative_to(REPO)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        if lines > MAX_FUNCTION_LINES:
          long.append(f"{relative}:{node.lineno} {node.name}: {lines} lines")
  assert not long, "\n".join(long)
