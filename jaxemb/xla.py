"""XLA compiler options for the jitted functions that run the encoder (evaluation and the train step), and the
other choices of how they compile per backend.

On the CPU, XLA hands dots to YNNPACK by default (jaxlib 0.10). For BERT's attention, batch x heads products of
[length, head_dim] matrices, YNNPACK is 2-3x slower than XLA's Eigen dots: the bert-base-sized forward at batch
64 x length 64 took 4.3 s with it and 3.8 s without (2 cores; bench/encoder_forward.py). The option is passed per
`jax.jit`, so other JAX code in the process keeps XLA's defaults, and only where this jaxlib knows it.
"""

import functools
import json
import os
from typing import Any, Callable

import jax

from jaxemb.errors import ConfigError

# Library fusion types handed to YNNPACK: none, so every dot goes to XLA's own (Eigen) kernels.
CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}
# A JSON object of XLA compiler options merged over CPU_OPTIONS, to try another CPU's best without editing code
# (e.g. '{"xla_cpu_prefer_vector_width": 512}'; docs/accelerators.md). The benchmarks print it.
OPTIONS_ENV = "JAXEMB_XLA_CPU_OPTIONS"


@functools.cache
def compiler_options() -> dict[str, Any] | None:
  """CPU_OPTIONS and $JAXEMB_XLA_CPU_OPTIONS's on the CPU when this jaxlib accepts them (checked once by compiling
  a no-op), else None. ConfigError for a variable that is not a JSON object or names options XLA refuses."""
  if jax.default_backend() != "cpu":
    return None
  extra = _options_from_env()
  options = {**CPU_OPTIONS, **extra}
  try:
    jax.jit(lambda x: x, compiler_options=options).lower(0.0).compile()
  except jax.errors.JaxRuntimeError as e:
    if extra:
      refusal = str(e).splitlines()[0]
      raise ConfigError(f"{OPTIONS_ENV}={os.environ[OPTIONS_ENV]}: XLA refuses it ({refusal})") from None
    return None  # An XLA without the option: its defaults.
  return options


def _options_from_env() -> dict[str, Any]:
  text = os.environ.get(OPTIONS_ENV, "").strip()
  try:
    options = json.loads(text) if text else {}
  except ValueError:
    options = None
  if not isinstance(options, dict):
    raise ConfigError(f"{OPTIONS_ENV}={text}: not a JSON object of XLA compiler options, such as "
                      '\'{"xla_cpu_prefer_vector_width": 512}\'')
  return options


def scan_unroll(num_layers: int) -> int:
  """The train step's `Transformer.scan_unroll` for `num_layers` scanned layers on this backend: on the CPU all of
  them, one loop trip, as the scan's loop cost a tenth of a MiniLM train step there (it stacks each layer's
  activations into buffers for the backward pass, one dynamic-update-slice at a time; SimCSE 2528 ms/step scanned,
  2255 ms unrolled, 2264 ms with a module per layer; bench/train_step.py); elsewhere 1, one layer compiled, which
  keeps bert-large's compile short."""
  return num_layers if jax.default_backend() == "cpu" else 1


def jit(fn: Callable[..., Any], **kwargs) -> Callable[..., Any]:
  """`jax.jit(fn, **kwargs)` with `compiler_options()`."""
  return jax.jit(fn, compiler_options=compiler_options(), **kwargs)


def use_compilation_cache(directory: str):
  """Keeps every compiled program in `directory` ("" leaves JAX's setting alone), so that later runs of
  evaluate.py and train.py load the encoder's bucket shapes and the train step instead of compiling them."""
  if directory:
    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # The CPU's 0.5 s compiles too.
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
