"""Data: SentEval's STS and transfer tasks, the training corpora (wiki1m, NLI triples) with their token cache and
per-step batches, and the download of what prepare.py fetches. The STS readers are exported here."""

from jaxemb.data.sts import (
  SOURCES,
  SPLITS,
  STS_YEARS,
  SUBSETS,
  TASKS,
  DataError,
  StsSubset,
  StsTask,
  add_period,
  join_tokens,
  load_sts_task,
  load_sts_tasks,
)
