"""A corpus's sentence vectors in shards: embed.py writes them (`jaxemb.embedding.job`), `load` reads them back.

from jaxemb import embedding
vectors, ids, manifest = embedding.load("runs/promptbert/wiki1m")  # [N, dim] memory-mapped, [N] ids
"""

from jaxemb.embedding.shards import Embeddings, Rows, load
