"""One process of a search on simulated devices, for tests/test_search.py: writes the neighbours of the queries and
of every corpus row (self_search) to an .npz, with the devices and processes it ran on.

Run as `python -m tests.search_host CORPUS.npy QUERIES.npy OUT.npz PROCESSES PROCESS_ID PORT` in a subprocess with
XLA_FLAGS=--xla_force_host_platform_device_count=N: the simulated device count is fixed when JAX starts. With
PROCESSES > 1 it joins the others at 127.0.0.1:PORT first (gloo's CPU collectives), as the hosts of a job do.
"""

import sys

import jax
import numpy as np

K = 7
BLOCK_ROWS = 12  # Rounded up to a multiple of the devices; the corpus ends in a partial block on each process.


def main(corpus_file: str, queries_file: str, out: str, processes: int, process_id: int, port: int):
  if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=processes, process_id=process_id)
  from jaxemb import search  # pylint: disable=import-outside-toplevel  # After jax.distributed is set up.

  corpus = np.load(corpus_file, mmap_mode="r")  # Each process reads its own rows of it.
  queries = np.load(queries_file)
  found = search.search(queries, corpus, K, block_rows=BLOCK_ROWS)
  itself = search.self_search(corpus, K, metric="dot", block_rows=BLOCK_ROWS)
  np.savez(
    out,
    scores=found.scores,
    rows=found.rows,
    self_scores=itself.scores,
    self_rows=itself.rows,
    devices=len(jax.devices()),
    local_devices=len(jax.local_devices()),
    processes=jax.process_count(),
  )


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7]))
