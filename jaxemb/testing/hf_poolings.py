"""Poolings over HF `hidden_states`, in numpy: what jaxemb's pooled methods are compared with."""

import numpy as np


def _mean(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
  return (x * mask).sum(1) / mask.sum(1)


# SimCSE's `cls_before_pooler` and `avg`, BERT-whitening's first-last (h0 + hL), SimCSE's first-layer variant
# (h1 + hL), top-2: name -> function of (hidden states, [batch, length, 1] mask).
HIDDEN_STATE_POOLINGS = {
  "cls_before_pooler": lambda h, mask: h[-1][:, 0],
  "last_avg": lambda h, mask: _mean(h[-1], mask),
  "first_last_avg": lambda h, mask: _mean((h[0] + h[-1]) / 2, mask),
  "first_layer_last_avg": lambda h, mask: _mean((h[1] + h[-1]) / 2, mask),
  "top2_avg": lambda h, mask: _mean((h[-2] + h[-1]) / 2, mask),
}
