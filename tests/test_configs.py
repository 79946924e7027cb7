"""The config files (configs/): each imports only ml_collections and other config files, so that reading one loads
neither JAX nor the library; the commands add the library's fields (jaxemb.cli.complete)."""

import subprocess
import sys

from tests.support import REPO

_IMPORT_EVERY_CONFIG = """
import importlib, pathlib, sys
for path in sorted(pathlib.Path("configs").rglob("*.py")):
  module = importlib.import_module(".".join(path.with_suffix("").parts))
  if hasattr(module, "get_config"):
    module.get_config()
print(sorted(name for name in sys.modules if name.split(".")[0] in ("jax", "jaxlib", "jaxemb", "transformers")))
"""


def test_config_files_import_no_library_code():
  done = subprocess.run(
    [sys.executable, "-c", _IMPORT_EVERY_CONFIG], capture_output=True, text=True, cwd=REPO, timeout=120, check=True
  )
  assert done.stdout.strip() == "[]", done.stdout
