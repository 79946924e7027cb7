"""BERT-flow (jaxemb/models/flow.py, jaxemb/methods/flow.py): the Glow against an independent float64 NumPy
transcription of bohanli/BERT-flow's flow (glow_ops_1x1.py under config_l3_d3_w32), its inverse, its data-dependent
init, the fit's optimizer step against a NumPy transcription of their AdamWeightDecayOptimizer, the likelihood rising,
the Encoder and evaluate.py's STS job."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxemb.encode import Encoder
from jaxemb.errors import ConfigError
from jaxemb.evaluation import run
from jaxemb.methods import Method, base
from jaxemb.methods import flow as flow_method
from jaxemb.models import flow
from jaxemb.spec import EvaluationRun
from tests.support import assert_float32_close, short_sts_job, short_stsb_test_sentences, transformer_roundings

CONFIG = flow.FlowConfig()  # The authors' 3 levels of 3 steps, coupling width 32.


@pytest.fixture(scope="module")
def sentences():
  return short_stsb_test_sentences()


def skewed(rows: int, width: int = 32, seed: int = 0) -> np.ndarray:
  """Correlated, skewed vectors, far from a standard Gaussian as pooled BERT states are: one distribution, the
  rows drawn with `seed`."""
  mixing = np.random.default_rng(0).standard_normal((width, width)) / 4
  return np.exp(0.5 * np.random.default_rng(seed).standard_normal((rows, width)) @ mixing).astype(np.float32)


def numpy_flow(params, x, config=CONFIG):
  """The latent and log-likelihood of glow_ops_1x1's encoder_decoder + top prior, in float64: per level `depth`
  revnet steps (actnorm (x + b) e^(3 logs); the reversal permutation; additive coupling x2 + NN(x1), NN = relu(actnorm(
  x W1)), relu(actnorm(. W2)), (. W3 + b3) e^(3 logs3)), then split off half as N(0, 1) latents."""
  f64 = lambda a: np.asarray(a, np.float64)

  def actnorm(p, h):
    return (h + f64(p["b"])) * np.exp(3 * f64(p["logs"])), 3 * f64(p["logs"]).sum()

  log_normal = lambda z: (-0.5 * z**2 - 0.5 * np.log(2 * np.pi)).sum(1)
  x, total, eps = f64(x), np.zeros(len(x)), []
  for level in range(config.levels):
    for step in range(config.depth):
      p = params[f"level_{level}"][f"step_{step}"]
      x, logdet = actnorm(p["actnorm"], x)
      total += logdet
      x = x @ np.eye(x.shape[1])[::-1]  # Their permutation's w: w[i][C - 1 - i] = 1.
      x1, x2 = x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2 :]
      c = p["coupling"]
      h = np.maximum(actnorm(c["hidden_0"]["actnorm"], x1 @ f64(c["hidden_0"]["kernel"]))[0], 0)
      h = np.maximum(actnorm(c["hidden_1"]["actnorm"], h @ f64(c["hidden_1"]["kernel"]))[0], 0)
      shift = (h @ f64(c["out"]["kernel"]) + f64(c["out"]["b"])) * np.exp(3 * f64(c["out"]["logs"]))
      x = np.concatenate([x1, x2 + shift], 1)
    if level < config.levels - 1:
      x, z = x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2 :]
      eps.append(z)
      total += log_normal(z)
  return np.concatenate(eps + [x], 1), total + log_normal(x)


def flow_roundings(config: flow.FlowConfig, channels: int = 32) -> int:
  """The flow's latent in tests/support.py's float32_atol's roundings, and its log-likelihood with the sums over the
  channels: per step of a level with c channels the actnorm (3), the 1 x 1 convolution's dot (c), the coupling
  network's three dots with their actnorms and activations (c / 2 + 4, width + 4, width + 3) and its addition (1);
  each level halves c; the log-likelihood then sums c log-normal terms and the steps' log-determinants (c + 3 and
  levels x depth)."""
  roundings, c = 0, channels
  for _ in range(config.levels):
    roundings += config.depth * (3 + c + c // 2 + 4 + 2 * config.width + 7 + 1)
    c //= 2
  return roundings + channels + 3 + config.levels * config.depth


@pytest.fixture(scope="module")
def fitted():
  """The default recipe's params and each step's mean log-likelihood, 64 steps on 1,024 vectors."""
  return flow_method.fit_flow(skewed(1024), CONFIG, epochs=2, batch_size=32, learning_rate=1e-3, seed=0)


@pytest.fixture(scope="module")
def trained(fitted):
  """Params moved off their init (the zero layers too), so every one of them matters."""
  return fitted[0]


def test_the_latent_and_likelihood_equal_a_float64_numpy_glow(trained):
  assert np.abs(trained["level_0"]["step_0"]["coupling"]["out"]["kernel"]).max() > 1e-3
  x = skewed(96, seed=1)
  z, log_likelihood = flow.forward(trained, jnp.asarray(x), CONFIG)
  expected_z, expected_ll = numpy_flow(jax.device_get(trained), x)
  # float32 against float64, on each output's scale (tests/support.py).
  assert_float32_close(z, expected_z, flow_roundings(CONFIG), evaluations=1)
  assert_float32_close(log_likelihood, expected_ll, flow_roundings(CONFIG), evaluations=1)


def test_the_inverse_reconstructs_the_vectors(trained):
  x = skewed(64, seed=2)
  z, _ = flow.forward(trained, jnp.asarray(x), CONFIG)

  def assert_back(params, z, config):  # There and back in float32: the flow's roundings twice, on both ends' scale.
    scale = max(np.abs(x).max(), np.abs(z).max())
    assert_float32_close(flow.inverse(params, z, config), x, 2 * flow_roundings(config), evaluations=1, scale=scale)

  assert_back(trained, z, CONFIG)
  one_level = flow.FlowConfig(levels=1, depth=2, width=8)  # No split: the last level alone.
  params = flow_method.fit_flow(x, one_level, epochs=2, batch_size=16, learning_rate=1e-3, seed=0)[0]
  assert_back(params, flow.forward(params, x, one_level)[0], one_level)


def test_every_actnorm_starts_at_zero_mean_and_unit_variance_on_the_first_batch():
  x = jnp.asarray(skewed(64))
  params = flow.init(jax.random.key(0), x, CONFIG)
  norm = params["level_0"]["step_0"]["actnorm"]
  h = (x + norm["b"]) * jnp.exp(3 * norm["logs"])
  # Zero up to float32's rounding of the init's mean and of this one (64 rows each) on h's scale.
  assert_float32_close(h.mean(0), np.zeros(h.shape[1]), 2 * 64 + 8, evaluations=1, scale=h)
  np.testing.assert_allclose(h.std(0), 1, atol=1e-4)
  z, _ = flow.forward(params, x, CONFIG)  # The zero layers leave every step's coupling the identity at init.
  np.testing.assert_allclose(z.std(0), 1, atol=1e-4)


def numpy_bert_adam_step(params, grads, m, v, lr, clip=1.0, b1=0.9, b2=0.999, eps=1e-6, decay=0.01):
  """optimization_bert_flow.py: clip_by_global_norm, then AdamWeightDecayOptimizer.apply_gradients."""
  norm = np.sqrt(sum((g**2).sum() for g in grads))
  grads = [g * clip / max(norm, clip) for g in grads]
  m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads)]
  v = [b2 * vi + (1 - b2) * g**2 for vi, g in zip(v, grads)]
  updates = [lr * (mi / (np.sqrt(vi) + eps) + decay * p) for mi, vi, p in zip(m, v, params)]
  return updates, m, v


def test_the_optimizer_steps_as_their_adam_weight_decay():
  rng = np.random.default_rng(0)
  params = [rng.standard_normal(5), rng.standard_normal((3, 2))]
  optimizer = optax.chain(  # fit_flow's.
    optax.clip_by_global_norm(1.0), flow_method._bert_adam(), optax.add_decayed_weights(0.01), optax.scale(-1e-3)
  )
  state = optimizer.init([jnp.asarray(p, jnp.float32) for p in params])
  m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
  for scale in (3.0, 0.1):  # Clipped, then not.
    grads = [scale * rng.standard_normal(p.shape) for p in params]
    updates, state = optimizer.update(
      [jnp.asarray(g, jnp.float32) for g in grads], state, [jnp.asarray(p, jnp.float32) for p in params]
    )
    expected, m, v = numpy_bert_adam_step(params, grads, m, v, 1e-3)
    # float32 against float64, on the scale of the update's two terms (they may cancel): the clip's global norm
    # (a sum of 11 squares, its root, the scaling: 15), the moments (4), the root, its sum and quotient, the decay,
    # the sum and the learning rate (6).
    terms = max(
      float(np.max(1e-3 * (np.abs(mi) / (np.sqrt(vi) + 1e-6) + 0.01 * np.abs(p)))) for mi, vi, p in zip(m, v, params)
    )
    for ours, theirs in zip(updates, expected):
      assert_float32_close(-np.asarray(ours), theirs, 25, evaluations=1, scale=terms)
    params = [p - u for p, u in zip(params, expected)]


def test_fitting_raises_the_likelihood(fitted):
  params, history = fitted
  assert history.shape == (2 * 1024 // 32,)
  assert history[-8:].mean() > history[:8].mean() + 2.0, history
  held_out = jnp.asarray(skewed(512, seed=3))
  init = flow.init(jax.random.key(0), jnp.asarray(skewed(32)), CONFIG)
  assert flow.forward(params, held_out, CONFIG)[1].mean() > flow.forward(init, held_out, CONFIG)[1].mean() + 2.0


def test_the_sts_job_fits_on_the_test_tasks_and_its_state_gives_the_flow_of_the_vectors(
  tiny_bert, sentences, tmp_path, capsys
):
  config = short_sts_job(tiny_bert, tmp_path / "sts.json", name="flow", source="last_avg", batch_size=16, epochs=2)
  summary = run.run_sts(EvaluationRun.from_config(config))
  out = capsys.readouterr().out
  assert "flow: fitted on the 72 distinct sentences of the test tasks STSBenchmark (" in out
  assert "| STSBenchmark | test  |" in out and summary["method"]["source"]["name"] == "last_avg"
  fitted = base.read_fitted(tmp_path / "sts.npz")
  assert fitted["fit/log_likelihood"].shape == (2 * (72 // 16),)
  method = Method.from_block(config.method)
  encoder = Encoder.from_pretrained(tiny_bert, method, fitted=tmp_path / "sts.npz")
  raw = Encoder.from_pretrained(tiny_bert, "last_avg").encode(sentences)
  params = jax.device_get(method.load_transform(encoder.config, fitted))
  # The encoder's last_avg (another program than raw's: two float32 forwards) through the float32 flow, against
  # float64's flow of raw, on the latent's scale (tests/support.py).
  roundings = transformer_roundings(encoder.config) + flow_roundings(method.flow_config)
  assert_float32_close(encoder.encode(sentences), numpy_flow(params, raw)[0], roundings)


def test_the_block_round_trips_and_bad_input_is_one_line(tiny_bert, sentences):
  method = Method("flow", source=Method("prompt", template='This sentence : "[X]" means [MASK] .'), coupling_width=16)
  assert Method.from_block(method.to_block()) == method
  assert Method.from_block({"name": "flow"}) == Method("flow", source=Method("first_last_avg"))
  # In a block the source is a block; in Python a method name stands for that method at its defaults.
  block = {"name": "flow", "source": {"name": "last_avg"}, "coupling_width": 16}
  assert Method.from_block(block) == Method("flow", source="last_avg", coupling_width=16)
  with pytest.raises(ConfigError, match="^flow batch_size must be a positive even number"):
    Method("flow", batch_size=7)
  with pytest.raises(ConfigError, match="^flow levels must be >= 1; got 0$"):
    Method("flow", levels=0)
  with pytest.raises(ConfigError, match="^method 'first_last_avg': a 6-level flow halves the channels 6 times; 32 "):
    Encoder.from_pretrained(tiny_bert, Method("flow", levels=6))
  with pytest.raises(ConfigError, match="^flow transforms a method that fits nothing itself"):
    Method("flow", source=Method("whitening"))
  with pytest.raises(ConfigError, match="^method 'flow' takes no dims"):
    Method("flow", dims=3)
  with pytest.raises(ConfigError, match="^flow fits on batches of 64 sentences; got 10 distinct sentences$"):
    Encoder.from_pretrained(tiny_bert, "flow").fit(sentences[:10])
