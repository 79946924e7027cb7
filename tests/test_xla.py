import jax
import jax.numpy as jnp

from jaxemb import xla


def test_cpu_dots_go_to_xla_not_ynnpack():
  assert jax.default_backend() == "cpu" and xla.compiler_options() == xla.CPU_OPTIONS
  q = jnp.ones((2, 8, 2, 4))
  compiled = xla.jit(lambda q: jax.nn.dot_product_attention(q, q, q)).lower(q).compile().as_text()
  assert "dot(" in compiled and "__ynn_fusion" not in compiled


def test_the_cpu_unrolls_the_scanned_layers():
  """One loop trip for every layer count (tests/models/test_bert.py checks that it changes nothing but the loop)."""
  assert [xla.scan_unroll(n) for n in (1, 6, 24)] == [1, 6, 24]
