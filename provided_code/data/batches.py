"""Batches by fancy indexing into stacked arrays, every patient once per epoch.

The order of epoch ``e`` depends only on ``(seed, e)``, so a run resumed at epoch ``e`` sees the
same batches as one that never stopped. Pure numpy: no TensorFlow here.
"""

from __future__ import annotations

import numpy as np


def check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"Invalid `batch_size`. Expected an integer >= 1. Received: batch_size={batch_size!r}")


def in_batches(rows: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """``rows`` cut into consecutive batches of ``batch_size``; the last may be smaller."""
    check_batch_size(batch_size)
    return [rows[start:start + batch_size] for start in range(0, len(rows), batch_size)]


def epoch_batches(num_patients: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
    """Row indices of each batch of epoch ``epoch`` (0-based); the last batch may be smaller."""
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(num_patients)
    else:
        order = np.arange(num_patients)
    return in_batches(order, batch_size)


def take_batch(arrays, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({"ct", "structure_masks"}, dose[..., None])`` for ``rows``: compact dtypes, what the model eats."""
    inputs = {"ct": arrays.ct[rows], "structure_masks": arrays.structure_masks[rows]}
    return inputs, arrays.dose[rows][..., None]


def epoch_updates(num_patients: int, batch_size: int, replicas: int, accumulate: int, seed: int, epoch: int,
                  shuffle: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """The optimizer updates of epoch ``epoch``: ``(rows, real)`` pairs of shape ``(accumulate, replicas, batch_size)``.

    Each update takes the next ``batch_size × replicas × accumulate`` patients of the epoch's order
    (``epoch_batches`` with that size): micro-batch ``m`` of replica ``r`` is ``rows[m, r]``. Every
    update is full, so that every replica and every worker runs the same number of steps on the
    same shapes: the last one is topped up with the epoch's first patients, marked ``real = False``
    (they count for nothing in the loss).
    """
    check_batch_size(batch_size)
    size = batch_size * replicas * accumulate
    order = np.concatenate(epoch_batches(num_patients, size, seed, epoch, shuffle))
    updates = []
    for start in range(0, num_patients, size):
        rows = order[start:start + size]
        real = np.ones(size, bool)
        if len(rows) < size:
            real[len(rows):] = False
            rows = np.concatenate([rows, np.resize(order, size - len(rows))])
        updates.append((rows.reshape(accumulate, replicas, batch_size), real.reshape(accumulate, replicas, batch_size)))
    return updates
