"""The top-level API: `from jaxemb import Encoder, Method, similarity`, the progress bar, cosine similarities."""

import io
import subprocess
import sys

import numpy as np
import pytest

from jaxemb import Encoder, Method, similarity
from tests.conftest import REPO


def test_package_import_stays_light():
  """`import jaxemb` (and so `import jaxemb.data`) loads no JAX; the API names load it on first use."""
  code = ("import sys, jaxemb; assert 'jax' not in sys.modules; "
          "from jaxemb import Encoder, Method, similarity; assert 'jax' in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_similarity_is_the_cosine_matrix():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(3, 5)).astype(np.float32), rng.normal(size=(4, 5)).astype(np.float32)
  scores = similarity(a, b)
  assert scores.shape == (3, 4) and scores.dtype == np.float32
  for i in range(3):
    for j in range(4):
      np.testing.assert_allclose(scores[i, j], a[i] @ b[j] / np.linalg.norm(a[i]) / np.linalg.norm(b[j]), rtol=1e-5)
  np.testing.assert_allclose(similarity(a[0], 2 * a[0]), [[1.0]], rtol=1e-6)  # 1-D: one row; scale-free.
  np.testing.assert_allclose(similarity(a[0], b), scores[:1])
  np.testing.assert_array_equal(similarity(np.zeros(5), b), np.zeros((1, 4)))
  with pytest.raises(ValueError, match="shapes"):
    similarity(a, b[:, :4])


class _Terminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_bar_on_a_terminal_for_long_inputs(tiny_bert, monkeypatch, capsys):
  encoder = Encoder.from_pretrained(tiny_bert, Method("last_avg"))
  sentences = [f"word {i}" for i in range(18)]  # One length: one compiled shape.
  seen = []
  encoder.encode(sentences, batch_size=2, progress=seen.append, show_progress=True)
  assert sum(seen) == 18 and "sentence" in capsys.readouterr().err
  encoder.encode(sentences, batch_size=2)  # Nine batches, but the captured stderr is no terminal.
  encoder.encode(sentences, batch_size=2, show_progress=False)
  assert capsys.readouterr().err == ""
  terminal = _Terminal()
  monkeypatch.setattr(sys, "stderr", terminal)
  encoder.encode(sentences[:16], batch_size=2)  # Eight batches: too few for a bar.
  assert terminal.getvalue() == ""
  vectors = encoder.encode(sentences, batch_size=2)
  assert "sentence" in terminal.getvalue()
  np.testing.assert_allclose(vectors, encoder.encode(sentences, batch_size=2, show_progress=False), atol=1e-6)
