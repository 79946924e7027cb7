import sys
import warnings

import jax
import jax.numpy as jnp
from jax._src import compilation_cache
import numpy as np
import pytest

from jaxemb import xla
from jaxemb.errors import ConfigError
from tests import support
from tests.support import USERS_XLA_OPTIONS


def compiled_text(fn, dtype, *args) -> str:
  """The program a user's process compiles for `fn` (tests/conftest.py compiles others in the pytest process)."""
  return xla.jit(fn, dtype).lower(*args).compile(compiler_options=USERS_XLA_OPTIONS).as_text()


@pytest.mark.skipif(not xla.onednn_dots(), reason="float32 dots go to oneDNN on x86 CPUs with AVX-512 only")
def test_float32_dots_go_to_onednn_not_ynnpack():
  assert jax.default_backend() == "cpu" and xla.compiler_options() == xla.CPU_OPTIONS["float32"]
  q = jnp.ones((2, 8, 2, 4))
  compiled = compiled_text(lambda q: jax.nn.dot_product_attention(q, q, q), jnp.float32, q)
  assert "onednn_fusion" in compiled and "ynn_fusion" not in compiled


def test_programs_of_few_rows_keep_eigen_dots():
  """oneDNN's per-dot overhead outweighs its kernels below ONEDNN_MIN_ROWS token rows per call; bfloat16 keeps
  YNNPACK's."""
  x = jnp.ones((16, 32))
  assert xla.is_few_rows(xla.ONEDNN_MIN_ROWS - 1) and not xla.is_few_rows(xla.ONEDNN_MIN_ROWS)
  assert "onednn_fusion" not in xla.jit(jnp.matmul, few_rows=True).lower(x, x.T).compile().as_text()
  assert xla.cpu_options(jnp.float32, few_rows=True) == xla.EIGEN_DOTS
  assert xla.cpu_options(jnp.bfloat16, few_rows=True) == xla.CPU_OPTIONS["bfloat16"]


@pytest.fixture
def cpu_flags(monkeypatch):
  """Sets the x86 CPU flags `xla.onednn_dots` reads (a function of the flags); the machine's own again after."""
  monkeypatch.setattr(xla, "_X86", True)
  monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
  xla.onednn_dots.cache_clear()
  yield lambda *flags: monkeypatch.setattr(xla, "_cpu_flags", lambda: frozenset(flags))
  xla.onednn_dots.cache_clear()


def test_float32_dots_go_to_onednn_only_with_avx512(cpu_flags, monkeypatch):
  """Below AVX-512, oneDNN's gemm kernels hang XLA's thread pool now and then (an AVX2 AMD EPYC: `embed.py` of a
  short batch of 512-token rows hung or crashed in 9 of 62 runs; bench/cpu_dots_stress.py): Eigen's dots."""
  cpu_flags("sse4_2", "avx", "avx2", "fma", "f16c")
  assert xla.cpu_options(jnp.float32) == xla.EIGEN_DOTS
  xla.onednn_dots.cache_clear()
  cpu_flags("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq")
  assert xla.cpu_options(jnp.float32) == xla.CPU_OPTIONS["float32"]
  xla.onednn_dots.cache_clear()
  monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # oneDNN told to keep to AVX2: its gemm kernels again.
  assert xla.cpu_options(jnp.float32) == xla.EIGEN_DOTS
  assert xla.cpu_options(jnp.bfloat16) == xla.CPU_OPTIONS["bfloat16"]  # YNNPACK's, on every CPU.


@pytest.mark.skipif(not xla._X86, reason="oneDNN is in x86 jaxlibs only")
def test_cached_programs_take_dots_xla_can_serialize():
  """XLA cannot write oneDNN's programs to the persistent cache (jaxlib 0.10.2; if a jaxlib can, the train step
  should go back to oneDNN's dots): a `cached` program (the train step) takes Eigen's dots; bfloat16's YNNPACK
  programs serialize, so they keep them."""
  assert not xla.serializable(xla.CPU_OPTIONS["float32"])
  assert xla.serializable(xla.EIGEN_DOTS) and xla.serializable(xla.CPU_OPTIONS["bfloat16"])
  assert xla.compiler_options(cached=True) == xla.EIGEN_DOTS
  assert xla.compiler_options(jnp.bfloat16, cached=True) == xla.CPU_OPTIONS["bfloat16"]


@pytest.fixture
def every_program_cached(tmp_path):
  """A persistent cache in `tmp_path` that takes every program, however short its compile, for the test; the
  process's own settings again after it (no cache: tests/conftest.py), the directory as well as the minimum compile
  time. JAX reads the settings once per process unless its cache is reset."""
  settings = {"jax_compilation_cache_dir": str(tmp_path), "jax_persistent_cache_min_compile_time_secs": 0.0}
  previous = {name: getattr(jax.config, name) for name in settings}
  support.set_compilation_cache(settings)
  yield
  support.set_compilation_cache(previous)


@pytest.mark.skipif(not xla._X86, reason="oneDNN is in x86 jaxlibs only")
def test_programs_xla_cannot_serialize_are_compiled_without_a_cache_write(every_program_cached):
  """jax.jit with oneDNN's options warns that it cannot write the program; xla.jit's does not try."""
  x = jnp.ones((3, 5))
  with pytest.warns(UserWarning, match="onednn-fusion"):
    jax.jit(lambda x: x @ x.T + 1, compiler_options=xla.CPU_OPTIONS["float32"])(x).block_until_ready()
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert float(xla.jit(lambda x: x @ x.T + 2)(x)[0, 0]) == 7.0
    # Compiled ahead of time too (a bench's or a test's `lower(...).compile()`).
    assert float(xla.jit(lambda x: x @ x.T + 3).lower(x).compile()(x)[0, 0]) == 8.0


@pytest.fixture
def users_cache(tmp_path):
  """The persistent cache the entry points turn on (`xla.use_compilation_cache`), in `tmp_path`; the process's own
  settings again after the test."""
  names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  previous = {name: getattr(jax.config, name) for name in (*names, "jax_persistent_cache_min_entry_size_bytes")}
  support.set_compilation_cache({})  # A cache another test of this worker made is made again, by the new factory.
  xla.use_compilation_cache(str(tmp_path))
  yield tmp_path
  support.set_compilation_cache(previous)


def _cut_short_probe(x):
  return jnp.sin(x) * 3.0


def test_a_cache_entry_a_fault_cut_short_is_removed_compiled_and_written_again(users_cache, capfd):
  """JAX writes an entry in place and keeps any file it finds: one cut short (a kill, a full disk) was read, warned
  about and compiled again by every later run. It is compiled once more, written whole and loaded from then on."""
  x = np.arange(6, dtype=np.float32)
  expected = np.asarray(jax.jit(_cut_short_probe)(x))
  [entry] = users_cache.glob("jit__cut_short_probe-*-cache")
  whole = entry.read_bytes()
  entry.write_bytes(whole[: len(whole) // 2])
  for run in range(2):  # A later run, then the one after it.
    jax.clear_caches()
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # JAX's "Error reading persistent compilation cache entry" is a UserWarning.
      np.testing.assert_array_equal(jax.jit(_cut_short_probe)(x), expected)
    compilation_cache.decompress_executable(entry.read_bytes())
    notes = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note:")]
    if run == 0:
      [note] = notes
      assert note.startswith(f"note: compilation cache entry {entry} did not read (")
      assert note.endswith("): removed, compiling it again")
    else:
      assert notes == []


def test_bfloat16_dots_multiply_in_bfloat16_on_the_cpu():
  """A bfloat16 dot returning float32 (`dot_output_dtype`) goes to YNNPACK with its bfloat16 operands; one returning
  bfloat16 is converted to a float32 dot by XLA."""
  assert xla.dot_output_dtype(jnp.bfloat16) == jnp.float32 and xla.dot_output_dtype(jnp.float32) is None
  x, w = jnp.ones((16, 32), jnp.bfloat16), jnp.ones((32, 24), jnp.bfloat16)  # A Dense's dot.
  native = compiled_text(lambda x, w: jnp.matmul(x, w, preferred_element_type=jnp.float32), jnp.bfloat16, x, w)
  upcast = compiled_text(lambda x, w: jnp.matmul(x, w), jnp.bfloat16, x, w)
  assert "ynn_fusion = f32[16,24]{1,0} fusion(%x.1, %w.1)" in native and "convert" not in native
  assert "f32[16,32]{1,0} fusion(%x.1)" in upcast  # An operand converted to float32.


@pytest.mark.parametrize("backend, unrolled", [("cpu", True), ("gpu", True), ("tpu", False)])
def test_the_cpu_and_gpus_unroll_the_scanned_layers_unless_they_remat(monkeypatch, backend, unrolled):
  """One loop trip for every layer count on the CPU and GPUs; a layer a trip on TPUs (tests/models/test_bert.py
  checks that it changes nothing but the loop, and that remat'd layers save memory only with the loop)."""
  monkeypatch.setattr(xla.jax, "default_backend", lambda: backend)
  assert [xla.scan_unroll(n, remat=False) for n in (1, 6, 24)] == ([1, 6, 24] if unrolled else [1, 1, 1])
  assert [xla.scan_unroll(n, remat=True) for n in (1, 6, 24)] == [1, 1, 1]


@pytest.fixture
def fresh_options():
  """compiler_options() read again (it is cached per process), and again after the test."""
  xla.compiler_options.cache_clear()
  yield
  xla.compiler_options.cache_clear()


def test_options_from_the_environment_are_merged_over_the_cpu_options(monkeypatch, fresh_options):
  monkeypatch.setenv(xla.OPTIONS_ENV, '{"xla_cpu_prefer_vector_width": 512}')
  assert xla.compiler_options() == {**xla.cpu_options(), "xla_cpu_prefer_vector_width": 512}
  assert float(xla.jit(lambda x: x * 2)(1.5)) == 3.0


def test_options_an_older_jaxlib_lacks_fall_back_to_eigen_dots(monkeypatch, fresh_options):
  monkeypatch.setattr(xla, "cpu_options", lambda *_: {"xla_cpu_option_from_the_future": True})
  assert xla.compiler_options() == xla.EIGEN_DOTS


@pytest.mark.parametrize(
  "value, message",
  [
    ("[1, 2]", "not a JSON object"),
    ("{oops", "not a JSON object"),
    ('{"xla_cpu_experimental_onednn_fusion_type": "dot"}', "XLA refuses it .*not a valid enum value"),
  ],
)
def test_a_bad_options_variable_is_one_clear_error(monkeypatch, fresh_options, value, message):
  monkeypatch.setenv(xla.OPTIONS_ENV, value)
  with pytest.raises(ConfigError, match=f"{xla.OPTIONS_ENV}=.*{message}"):
    xla.compiler_options()


# A program with 128 MB of temporaries (a [8192, 4096] float32 intermediate between two dots): minor page faults per
# call, after a first call, in a fresh process with and without keep_step_memory.
_FAULTS_PER_CALL = """
import resource, sys
import jax, jax.numpy as jnp
from jaxemb import xla
kept = xla.keep_step_memory() if sys.argv[1] == "kept" else False
step = jax.jit(lambda x, w: (jnp.tanh(x @ w) @ w.T).sum())
x, w = jnp.ones((8192, 64)) / 64, jnp.ones((64, 4096)) / 64
step(x, w).block_until_ready()
faults = []
for _ in range(3):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  step(x, w).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(kept, min(faults))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's mallopt")
def test_kept_step_memory_is_not_faulted_in_again_each_call():
  """XLA's CPU client allocates a call's temporaries afresh, and glibc maps and unmaps them each call (32,769 page
  faults a call here); keep_step_memory, called before the backend starts as train() calls it, has later calls
  reuse the pages."""
  kept, kept_faults = support.python_on_devices(_FAULTS_PER_CALL, 1, "kept", users_compiles=True).split()
  default, default_faults = support.python_on_devices(_FAULTS_PER_CALL, 1, "default", users_compiles=True).split()
  assert (kept, default) == ("True", "False")
  assert int(default_faults) > 25_000 and int(kept_faults) < 2_000, (default_faults, kept_faults)


def test_step_memory_is_left_alone_once_the_backend_has_started():
  """The CPU client reads its dispatch mode once, when made: after that keep_step_memory changes nothing."""
  jax.devices()
  assert not xla.keep_step_memory() and jax.config.read("jax_cpu_enable_async_dispatch")
