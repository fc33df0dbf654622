"""Batches by fancy indexing into stacked arrays, every patient once per epoch.

The order of epoch ``e`` depends only on ``(seed, e)``, so a run resumed at epoch ``e`` sees the
same batches as one that never stopped. Pure numpy: no TensorFlow here.
"""

from __future__ import annotations

import numpy as np

from provided_code.errors import UserError
from provided_code.inputs import ANGLES, InputSpec, default_inputs


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


def take_batch(arrays, rows: np.ndarray, inputs: tuple[InputSpec, ...] | None = None,
               ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``(model inputs, dose[..., None])`` for ``rows``: compact dtypes, what the model eats
    (:func:`take_inputs`)."""
    return take_inputs(arrays, rows, inputs), arrays.dose[rows][..., None]


def take_inputs(arrays, rows: np.ndarray, inputs: tuple[InputSpec, ...] | None = None) -> dict[str, np.ndarray]:
    """Each declared input (default: OpenKBP's ``ct`` and ``structure_masks``) of the patients at
    ``rows``, read from the ``arrays`` field of its name: volumes by fancy indexing, vectors (per
    patient prescriptions, beam angles) fitted to the declared length by :func:`patient_vectors`."""
    return {spec.name: getattr(arrays, spec.name)[rows] if spec.is_volume else patient_vectors(arrays, spec, rows)
            for spec in inputs or default_inputs()}


def patient_vectors(arrays, spec: InputSpec, rows: np.ndarray | None = None) -> np.ndarray:
    """``(len(rows), spec.length)`` float32: the per-patient vector input ``spec`` of the patients
    at ``rows`` (default: all).

    ``arrays`` without the field (or with None there) gives every patient ``spec.default``, the
    run-wide value. Prescriptions: a patient's NaN columns take the default's. Angles: the
    patient's finite angles first, NaN after them (the field may be narrower or wider than
    ``spec.length``); a patient without any takes the run-wide angles. A patient with more angles
    than the model's slots, or, with ``spec.all_slots``, fewer, is refused naming it.
    """
    count = arrays.ct.shape[0]
    rows = np.arange(count) if rows is None else np.asarray(rows).reshape(-1)
    default = np.asarray(spec.default, np.float32)
    given = getattr(arrays, spec.name, None)
    given = np.broadcast_to(default, (len(rows), spec.length)) if given is None else np.asarray(given[rows], np.float32)
    if spec.moves != ANGLES:
        return np.where(np.isfinite(given), given, default).astype(np.float32)
    out = np.full((len(rows), spec.length), np.nan, np.float32)
    ids = getattr(arrays, "patient_ids", None)
    for n, row in enumerate(given):
        values = row[np.isfinite(row)]
        if not values.size:
            values = default[np.isfinite(default)]
        name = ids[rows[n]] if ids is not None else f"#{rows[n]}"
        if len(values) > spec.length:
            raise InputError(f"Patient {name}: {len(values)} beams; the model takes at most {spec.length} (the most "
                             f"any patient it was trained on had)")
        if spec.all_slots and len(values) != spec.length:
            raise InputError(f"Patient {name}: {len(values)} beams; the model makes one channel per beam "
                             f"(--beam-channels each) for exactly {spec.length}, so every patient needs that many")
        out[n, :len(values)] = values
    return out


class InputError(UserError, ValueError):
    """A patient's per-patient input does not fit the model (too many beams for its slots)."""


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
