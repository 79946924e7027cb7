import jax
import jax.numpy as jnp
import pytest

from jaxemb import xla
from jaxemb.errors import ConfigError


def test_cpu_dots_go_to_xla_not_ynnpack():
  assert jax.default_backend() == "cpu" and xla.compiler_options() == xla.CPU_OPTIONS
  q = jnp.ones((2, 8, 2, 4))
  compiled = xla.jit(lambda q: jax.nn.dot_product_attention(q, q, q)).lower(q).compile().as_text()
  assert "dot(" in compiled and "__ynn_fusion" not in compiled


def test_the_cpu_unrolls_the_scanned_layers():
  """One loop trip for every layer count (tests/models/test_bert.py checks that it changes nothing but the loop)."""
  assert [xla.scan_unroll(n) for n in (1, 6, 24)] == [1, 6, 24]


@pytest.fixture
def fresh_options():
  """compiler_options() read again (it is cached per process), and again after the test."""
  xla.compiler_options.cache_clear()
  yield
  xla.compiler_options.cache_clear()


def test_options_from_the_environment_are_merged_over_the_cpu_options(monkeypatch, fresh_options):
  monkeypatch.setenv(xla.OPTIONS_ENV, '{"xla_cpu_prefer_vector_width": 512}')
  assert xla.compiler_options() == {**xla.CPU_OPTIONS, "xla_cpu_prefer_vector_width": 512}
  assert float(xla.jit(lambda x: x * 2)(1.5)) == 3.0


@pytest.mark.parametrize("value, message", [
    ("[1, 2]", "not a JSON object"),
    ("{oops", "not a JSON object"),
    ('{"xla_cpu_experimental_onednn_fusion_type": "dot"}', "XLA refuses it .*not a valid enum value"),
])
def test_a_bad_options_variable_is_one_clear_error(monkeypatch, fresh_options, value, message):
  monkeypatch.setenv(xla.OPTIONS_ENV, value)
  with pytest.raises(ConfigError, match=f"{xla.OPTIONS_ENV}=.*{message}"):
    xla.compiler_options()
