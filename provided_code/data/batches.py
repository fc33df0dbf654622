"""Batches by fancy indexing into stacked arrays, every patient once per epoch.

The order of epoch ``e`` depends only on ``(seed, e)``, so a run resumed at epoch ``e`` sees the
same batches as one that never stopped. Pure numpy: no TensorFlow here.
"""

from __future__ import annotations

import numpy as np


def check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"Invalid `batch_size`. Expected an integer >= 1. Received: batch_size={batch_size!r}")


def epoch_batches(num_patients: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True) -> list[np.ndarray]:
    """Row indices of each batch of epoch ``epoch`` (0-based); the last batch may be smaller."""
    check_batch_size(batch_size)
    if shuffle:
        order = np.random.default_rng([seed, epoch]).permutation(num_patients)
    else:
        order = np.arange(num_patients)
    return [order[start:start + batch_size] for start in range(0, num_patients, batch_size)]


def take_batch(arrays, rows: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({"ct", "structure_masks"}, dose[..., None])`` for ``rows``: compact dtypes, what the model eats."""
    inputs = {"ct": arrays.ct[rows], "structure_masks": arrays.structure_masks[rows]}
    return inputs, arrays.dose[rows][..., None]
