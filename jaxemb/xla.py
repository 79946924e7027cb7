"""XLA compiler options for the jitted functions that run the encoder (evaluation and the train step), and the
other choices of how they compile per backend.

On the CPU, XLA hands dots to YNNPACK by default (jaxlib 0.10), and upcasts a bfloat16 dot whole to float32. Per
compute dtype jaxemb picks the library each dot goes to (bench/encoder_forward.py, docs/benchmarks.md):
- float32: oneDNN's matmuls on x86 CPUs with AVX-512 (the library torch's CPU matmuls come from; XLA's Eigen dots
  elsewhere, see `onednn_dots`).
  YNNPACK is 2-3x slower than Eigen on BERT's attention products (batch x heads of [length, head_dim]
  matrices): the bert-base-sized forward at batch 64 x 64 took 4.3 s with it and 3.8 s without (2 cores).
  oneDNN's were 1-13% faster than Eigen's in the forward and 2-4% in the train step on an AMD EPYC Zen 4; on Intel
  Xeons, where Eigen's dots reached 270-290 GF/s against torch's 350-400, they are Intel's own kernels. Calls of
  few token rows (ONEDNN_MIN_ROWS) keep Eigen's, whose per-dot overhead is lower.
- bfloat16: YNNPACK's, dot by dot, given dots that return float32 (`dot_output_dtype`): bf16 multiplies with
  float32 sums, 2x the float32 rate with AVX512-BF16 (394 against 206 GF/s), where XLA's own path converts the
  operands to float32 first.
The options are passed per `jax.jit`, so other JAX code in the process keeps XLA's defaults, and only where this
jaxlib knows them.

XLA cannot write a program with oneDNN's dots to the persistent compilation cache (jaxlib 0.10.2: "ToProto is not
implemented for thunk kind: onednn-fusion"), so each program gets what is faster over a first and a second run
(docs/benchmarks.md, "Cold and warm starts"): the encoder's forward keeps oneDNN's dots and compiles on every run
(faster even so than Eigen's loaded from the cache), without trying to write itself to the cache; the train step,
whose compile costs more than oneDNN's few percent a step give back in a CPU run, is `cached`: Eigen's dots.
"""

import contextlib
import ctypes
import functools
import json
import math
import os
import pathlib
import platform
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax._src import compilation_cache, compilation_cache_interface  # To check its entries (_check_entries_read).
from jax._src import config as jax_config  # For a per-compile cache setting; jax has no public one.
from jax.experimental import serialize_executable

from jaxemb.errors import ConfigError

# No library fusion types: every dot stays with XLA (its Eigen kernels; jaxemb's float32 choice before oneDNN).
EIGEN_DOTS = {"xla_cpu_experimental_ynn_fusion_type": ""}
# Per compute dtype name: the CPU options of the programs that compute in it (see the module docstring).
CPU_OPTIONS = {
  "float32": {
    **EIGEN_DOTS,
    "xla_cpu_use_onednn": True,
    "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT",
  },
  "bfloat16": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"},
}
# oneDNN is built into x86 jaxlibs only; other CPUs keep XLA's Eigen dots for float32.
_X86 = platform.machine().lower() in ("x86_64", "amd64")
# The CPU flags of oneDNN's avx512_core, the ISA of the f32 matmul kernels jaxemb's choice of oneDNN was measured with
# (brgemm); below it oneDNN takes its gemm kernels, which XLA's oneDNN thread pool deadlocks on (`onednn_dots`).
_AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
# Token rows (batch x length) a device's call encodes below which float32 dots stay with Eigen: oneDNN's per-dot
# overhead outweighs its faster kernels there (MiniLM forward, 4 x 16 tokens: 11.3 ms with Eigen's, 12.6 ms with
# oneDNN's; 16 x 32: 63.0 and 58.7 ms; the tiny test models' steps, 5% of the test suite's time).
ONEDNN_MIN_ROWS = 256
# A JSON object of XLA compiler options merged over CPU_OPTIONS, to try another CPU's best without editing code
# (e.g. '{"xla_cpu_prefer_vector_width": 512}'; docs/accelerators.md). The benchmarks print it.
OPTIONS_ENV = "JAXEMB_XLA_CPU_OPTIONS"


def cpu_options(dtype: Any = jnp.float32, few_rows: bool = False) -> dict[str, Any]:
  """CPU_OPTIONS for programs computing in `dtype` (other dtypes: float32's) on this machine, EIGEN_DOTS instead
  of oneDNN's for `few_rows` (fewer than ONEDNN_MIN_ROWS per call)."""
  options = CPU_OPTIONS.get(jnp.dtype(dtype).name, CPU_OPTIONS["float32"])
  if "xla_cpu_use_onednn" in options and (few_rows or not onednn_dots()):
    options = EIGEN_DOTS
  return dict(options)


@functools.cache
def onednn_dots() -> bool:
  """Whether float32 dots go to oneDNN on this machine: an x86 CPU with AVX-512 (oneDNN's avx512_core, not capped
  below it by $ONEDNN_MAX_CPU_ISA). Below it oneDNN runs a float32 matmul through its gemm kernels, which split their
  work again inside the tasks of XLA's thread pool for oneDNN, and that pool (jaxlib 0.10.2) sometimes never runs the
  inner split: on an AVX2 AMD EPYC, 9 of 62 `embed.py` runs that encoded a short batch of long rows hung for good or
  crashed, none of 50 with Eigen's dots (docs/benchmarks.md, "oneDNN's dots without AVX-512")."""
  if not _X86:
    return False
  capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
  return _AVX512_CORE <= _cpu_flags() and capped.startswith(("ALL", "AVX512", "AVX10"))


def _cpu_flags() -> frozenset[str]:
  """The CPU's feature flags as Linux lists them (none elsewhere, where jaxemb then keeps Eigen's dots)."""
  return frozenset(cpu_info().get("flags", "").split())


def cpu_info() -> dict[str, str]:
  """The first processor's fields in /proc/cpuinfo ("model name", "flags", ...); none where there is no such file."""
  try:
    text = pathlib.Path("/proc/cpuinfo").read_text(encoding="utf-8")
  except OSError:
    return {}
  fields = (line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
  return {key.strip(): value.strip() for key, value in fields}


def dot_output_dtype(dtype: Any) -> Any:
  """The `Transformer.dot_output_dtype` (its default) of an encoder computing in `dtype` on this backend: float32
  for bfloat16 on the CPU, whose YNNPACK dots take bfloat16 operands only with float32 results; else None (dots
  return `dtype`, as accelerators' do, summing in float32 inside)."""
  if jax.default_backend() == "cpu" and jnp.dtype(dtype) == jnp.bfloat16:
    return jnp.float32
  return None


@functools.cache
def compiler_options(dtype: Any = jnp.float32, few_rows: bool = False, cached: bool = False) -> dict[str, Any] | None:
  """`cpu_options(dtype, few_rows)` and $JAXEMB_XLA_CPU_OPTIONS's on the CPU when this jaxlib accepts them (checked
  once per choice by compiling a probe), else EIGEN_DOTS if it accepts that, else None (XLA's defaults). For a
  `cached` program (one that later runs must load from the persistent cache) options whose programs XLA cannot
  serialize give way to EIGEN_DOTS, unless $JAXEMB_XLA_CPU_OPTIONS names them.
  ConfigError for a variable that is not a JSON object or names options XLA refuses."""
  if jax.default_backend() != "cpu":
    return None
  extra = _options_from_env()
  preferred = cpu_options(dtype, few_rows)
  if cached and not serializable(preferred):
    preferred = EIGEN_DOTS
  for options in ({**preferred, **extra}, EIGEN_DOTS):
    refusal = _probe(json.dumps(options, sort_keys=True))[0]
    if refusal is None:
      return options
    if extra:
      raise ConfigError(f"{OPTIONS_ENV}={os.environ[OPTIONS_ENV]}: XLA refuses it ({refusal})")
  return None


def serializable(options: dict[str, Any]) -> bool:
  """Whether XLA can write programs compiled with `options` to the persistent cache (False also when XLA refuses
  them)."""
  return _probe(json.dumps(options, sort_keys=True))[1]


@functools.cache
def _probe(options_json: str) -> tuple[str | None, bool]:
  """(why XLA refuses the options of `options_json`, None if it accepts them; whether it can serialize what they
  compile), from one compile of a one-dot program, which any dot library they choose takes (not cached)."""
  operand = jax.ShapeDtypeStruct((2, 2), jnp.float32)
  try:
    with no_cache_writes():
      compiled = jax.jit(_dot_probe, compiler_options=json.loads(options_json)).lower(operand).compile()
  except jax.errors.JaxRuntimeError as e:
    return str(e).splitlines()[0], False
  try:
    serialize_executable.serialize(compiled)
    return None, True
  except jax.errors.JaxRuntimeError:
    return None, False


def _dot_probe(a: jax.Array) -> jax.Array:
  return a @ a


def no_cache_writes() -> contextlib.AbstractContextManager:
  """Programs compiled in this block (in this thread) are not offered to the persistent cache: JAX then neither
  tries to serialize them nor warns that it cannot."""
  return jax_config.persistent_cache_min_compile_time_secs(math.inf)


def _options_from_env() -> dict[str, Any]:
  text = os.environ.get(OPTIONS_ENV, "").strip()
  try:
    options = json.loads(text) if text else {}
  except ValueError:
    options = None
  if not isinstance(options, dict):
    raise ConfigError(
      f"{OPTIONS_ENV}={text}: not a JSON object of XLA compiler options, such as "
      "'{\"xla_cpu_prefer_vector_width\": 512}'"
    )
  return options


def scan_unroll(num_layers: int, remat: bool) -> int:
  """The train step's `Transformer.scan_unroll` for `num_layers` scanned layers on this backend: all of them, one
  loop trip, on the CPU and GPUs, where the loop stacks each layer's activations into buffers for the backward pass
  one dynamic-update-slice at a time: a tenth of a MiniLM step on the CPU (SimCSE 2528 ms/step scanned, 2255 ms
  unrolled; bench/train_step.py), a quarter of bert-base's on an H200, where unrolled PromptBERT, SimCSE and
  CoT-BERT steps ran 1.42x, 1.46x and 1.42x as many steps/s in about half the memory, and made up for their longer
  compile within 900-1,600 steps (a wiki1m epoch at batch 256 is 3,906; docs/benchmarks.md, "The unrolled step on a
  GPU"). On TPUs, unmeasured, 1: one layer compiled. Layers that `remat` (config.model.remat_policy other than
  "none") keep the loop everywhere: unrolled whole, XLA recomputed their forward as early as the first one and saved
  no memory (bert-base's SimCSE step at batch 16: 1.43 GB of temporaries with "full" and without, 0.91 GB with the
  loop)."""
  return num_layers if jax.default_backend() in ("cpu", "gpu") and not remat else 1


def stacks_encoder_calls() -> bool:
  """Whether a train step runs its encoder passes of near shapes as one call (jaxemb.training.encoder_calls): on
  accelerators, where each call is a program of small kernels and CoT-BERT's twelve calls compiled for minutes when
  unrolled; not on the CPU, where one call over the stacked parts was slower than a call per part (MiniLM, two
  views of 64 x 42 tokens, forward and backward on an AMD EPYC Zen 4: 2270 ms apart, 2680 ms stacked under vmap,
  2418 ms concatenated; the PromptBERT step 4-6% slower stacked, CoT-BERT's 5-11%)."""
  return jax.default_backend() != "cpu"


def steps_per_call() -> int:
  """The train loop's optimizer steps per call of the jitted steps (`config.train.steps_per_call` unset) on this
  backend: 4 on the CPU, whose client allocates a call's temporaries afresh (a MiniLM PromptBERT step on a 2-core
  Xeon VM: 3009 ms and 384,000 page faults one a call, 2756 ms and 97,000 four a call; docs/benchmarks.md); 1
  elsewhere (no loop): on an H200 four a call ran bert-base's PromptBERT and SimCSE steps 3-5% slower and compiled
  longer (docs/benchmarks.md, "Steps per call and the unrolled compile on a GPU")."""
  return 4 if jax.default_backend() == "cpu" else 1


# glibc's mallopt parameters (malloc.h): the most mmap'd chunks, the free top of the heap kept before it is returned
# to the system, and the extra asked of the system each time the heap grows.
_M_MMAP_MAX, _M_TRIM_THRESHOLD, _M_TOP_PAD = -4, -1, -2


def keep_step_memory() -> bool:
  """Has the train step's temporaries stay mapped in this process from call to call on the CPU; True where it could.

  XLA's CPU client allocates a call's temporary buffer afresh (1.5 GB for a MiniLM PromptBERT step at batch 64), on
  its dispatch thread, where glibc serves it from a fresh mmap and unmaps it when the call ends: every call faults
  its pages in again, and on a VM whose host takes back freed guest memory each fault cost 17 us when another
  program had used the memory in between (docs/benchmarks.md, "Keeping the step's memory"). Here calls run on the
  calling thread (`jax_cpu_enable_async_dispatch`, which the CPU client reads once, when it is made: so this must
  run before the backend starts, and single-device programs only) and glibc keeps every chunk in its main heap and
  never returns it, so a call reuses the pages the last one faulted in. The process's memory then stays at its
  peak. False, with glibc left alone, on accelerators (whose step the CPU client's dispatch mode does not touch)
  and without glibc's mallopt."""
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top  # Whether the client was made; no public API.

  if xla_bridge.backends_are_initialized():
    return False
  jax.config.update("jax_cpu_enable_async_dispatch", False)
  if jax.default_backend() != "cpu":
    return False
  try:
    mallopt = ctypes.CDLL(None).mallopt
  except (AttributeError, OSError):  # Not glibc (musl, macOS).
    return False
  return all(
    mallopt(option, value) == 1
    for option, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1), (_M_TOP_PAD, 64 << 20))
  )


def compile_flops() -> float:
  """What compiling one more bucket shape of the encoder costs on this backend, in the encoder's FLOPs
  (jaxemb.buckets.merged_widths; config.eval.compile_flops -1). On the CPU 1.2e11, a shape's ~1 s of compiling at
  the ~1.2e11 FLOP/s of MiniLM's forward on a 2-core AMD EPYC: as fast as each width its own shape (evaluate.py's 7
  STS tasks 104.3 s in 9 shapes against 106.1 s in 13, the same scores; embed.py on the wiki sample 144-148 against
  142-146 sentences/s) in 8-12% less peak memory, the compiled programs' (docs/benchmarks.md). Elsewhere 1e15, a
  shape's compile and autotuning on an H200 (~5 s: eleven shapes in a 56-59 s cold evaluation) at the ~2e14 FLOP/s
  its bfloat16 forward reached (bert-base, 128 x 64 tokens: 35% of 790 TFLOP/s)."""
  return 1.2e11 if jax.default_backend() == "cpu" else 1e15


def is_few_rows(rows: int) -> bool:
  """Whether a call of `rows` token rows (batch x length) per device is below ONEDNN_MIN_ROWS: `jit`'s few_rows."""
  return rows < ONEDNN_MIN_ROWS


def jit(
  fn: Callable[..., Any], dtype: Any = jnp.float32, few_rows: bool = False, cached: bool = False, **kwargs
) -> Callable[..., Any]:
  """`jax.jit(fn, **kwargs)` with `compiler_options(dtype, few_rows, cached)`: `fn` computes in `dtype`, on few
  token rows per device and call (`is_few_rows`) or many, and is `cached` or not (see the module docstring). A
  program XLA cannot serialize is compiled without a cache write."""
  options = compiler_options(dtype, few_rows, cached)
  jitted = jax.jit(fn, compiler_options=options, **kwargs)
  if options is None or serializable(options):
    return jitted
  return _Uncached(jitted)


class _Uncached:
  """A jitted function whose calls, and whose ahead-of-time `lower(...).compile()`, compile under
  `no_cache_writes`; its other attributes are the jitted one's."""

  def __init__(self, jitted: Callable[..., Any]):
    self._jitted = jitted

  def __call__(self, *args, **kwargs):
    with no_cache_writes():
      return self._jitted(*args, **kwargs)

  def lower(self, *args, **kwargs) -> "_UncachedLowered":
    return _UncachedLowered(self._jitted.lower(*args, **kwargs))

  def __getattr__(self, name: str) -> Any:
    return getattr(self._jitted, name)


class _UncachedLowered:
  """A `jax.stages.Lowered` whose `compile` runs under `no_cache_writes`; its other attributes are the Lowered's."""

  def __init__(self, lowered: jax.stages.Lowered):
    self._lowered = lowered

  def compile(self, *args, **kwargs) -> jax.stages.Compiled:
    with no_cache_writes():
      return self._lowered.compile(*args, **kwargs)

  def __getattr__(self, name: str) -> Any:
    return getattr(self._lowered, name)


def use_compilation_cache(directory: str):
  """Keeps every compiled program in `directory` ("" leaves JAX's setting alone), so that later runs of
  evaluate.py and train.py load the encoder's bucket shapes and the train step instead of compiling them."""
  if directory:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # The CPU's 0.5 s compiles too.
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _check_entries_read()


def _check_entries_read():
  """Has JAX's file cache, from now on in this process, treat an entry that does not decompress as absent, after
  removing it, so that the program is compiled and written again whole. JAX writes an entry in place and never
  replaces one (jaxlib 0.10.2's LRUCache.put: a file that exists is kept): an entry a kill or a full disk cut short
  was otherwise read, warned about and compiled again by every later run, the train step's minutes included. JAX
  has no public hook for its cache object: `get_file_cache` is the factory its cache is made by, once a process
  and after each reset."""
  make = compilation_cache.get_file_cache
  if not isinstance(make, _CheckedFactory):
    compilation_cache.get_file_cache = _CheckedFactory(make)


class _CheckedFactory:
  """`compilation_cache.get_file_cache` that wraps the cache it makes in `_CheckedEntries`."""

  def __init__(self, make: Callable[[str], Any]):
    self._make = make

  def __call__(self, path: str) -> Any:
    made = self._make(path)
    return None if made is None else (_CheckedEntries(made[0]), made[1])


class _CheckedEntries(compilation_cache_interface.CacheInterface):
  """A JAX file cache whose `get` removes an entry that does not decompress and returns None (a miss)."""

  def __init__(self, cache: compilation_cache_interface.CacheInterface):
    self._cache = cache
    self._path = cache._path  # pylint: disable=protected-access

  def get(self, key: str) -> bytes | None:
    value = self._cache.get(key)
    if value is None:
      return None
    try:
      compilation_cache.decompress_executable(value)
    except Exception as e:  # pylint: disable=broad-exception-caught  # zlib's, zstd's: the stream is cut or garbled.
      entry = self._path / f"{key}-cache"
      entry.unlink(missing_ok=True)
      print(f"note: compilation cache entry {entry} did not read ({e}): removed, compiling it again", file=sys.stderr)
      return None
    return value

  def put(self, key: str, value: bytes) -> None:
    self._cache.put(key, value)
