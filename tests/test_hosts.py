"""Which environments start a multi-host job (jaxemb/hosts.py), checked without one: the configured coordinator,
a SLURM job step of several tasks; not a plain machine, one task or a Kubernetes pod. Jobs for real:
tests/training/test_multihost.py, tests/test_embed.py, tests/test_search.py."""

import os
import warnings

import jax
import pytest

from jaxemb import hosts
from tests.support import slurm_task


@pytest.fixture
def initialize_calls(monkeypatch):
  """What join_job asks of jax (config updates and jax.distributed.initialize's arguments), recorded
  instead of made, in an environment of no cluster: no SLURM, Open MPI or Kubernetes variables."""
  for name in list(os.environ):
    if name.startswith(("SLURM_", "OMPI_")) or name in ("KUBERNETES_SERVICE_HOST", "JAX_COORDINATOR_PORT"):
      monkeypatch.delenv(name)
  calls = []
  monkeypatch.setattr(jax.config, "update", lambda name, value: calls.append((name, value)))
  monkeypatch.setattr(jax.distributed, "initialize", lambda **given: calls.append(given))
  return calls


def test_the_configured_coordinator_is_joined_wherever_it_runs(initialize_calls, monkeypatch):
  """The flags win over a detected cluster: a process of a SLURM job may join a job of its own."""
  for name, value in slurm_task(0, 4).items():
    monkeypatch.setenv(name, value)
  hosts.join_job("10.0.0.1:1234", num_processes=2, process_id=1)
  assert initialize_calls == [
    ("jax_cpu_collectives_implementation", "gloo"),
    {"coordinator_address": "10.0.0.1:1234", "num_processes": 2, "process_id": 1},
  ]


@pytest.mark.parametrize(
  "variables, joins",
  [({}, False), (slurm_task(0, 1), False), (slurm_task(1, 2), True), ({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, False)],
  ids=["no cluster", "SLURM, 1 task", "SLURM, 2 tasks", "a Kubernetes pod"],
)
def test_a_detected_cluster_of_several_processes_is_joined(initialize_calls, monkeypatch, variables, joins):
  """A plain machine, a job step of one task or a Kubernetes pod (not a cluster jaxemb joins) starts no
  coordinator; one of several tasks leaves jax to fill in the coordinator, the process count and id."""
  for name, value in variables.items():
    monkeypatch.setenv(name, value)
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # jax's Kubernetes detection warns in a pod without the kubernetes package.
    hosts.join_job()
  assert initialize_calls == (
    [("jax_cpu_collectives_implementation", "gloo"), {"cluster_detection_method": "slurm"}] if joins else []
  )


def test_a_process_joins_once(initialize_calls, monkeypatch):
  """A sweep's second train() in a joined process initialises nothing again (jax would raise)."""
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  hosts.join_job("10.0.0.1:1234", num_processes=2, process_id=1)
  assert not initialize_calls
