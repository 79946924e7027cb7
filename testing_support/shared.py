"""The ../shared folder: the SentEval data, the wiki1m and NLI samples, the tokenizers and the one real checkpoint
the tests and benchmarks read (README: Tests)."""

import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = pathlib.Path(os.environ.get("JAXEMB_SHARED", REPO.parent / "shared"))
