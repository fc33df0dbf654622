"""Batches by fancy indexing into stacked arrays, every patient once per epoch.

The order of epoch ``e`` depends only on ``(seed, e)``, so a run resumed at epoch ``e`` sees the
same batches as one that never stopped. Pure numpy: no TensorFlow here.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import numpy as np

from provided_code.constants import BEAMS_FILE, PRESCRIPTIONS_FILE
from provided_code.errors import UserError
from provided_code.model_spec import ANGLES, InputSpec

logger = logging.getLogger(__name__)


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


def take_batch(arrays, rows: np.ndarray, inputs: tuple[InputSpec, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``(model inputs, dose[..., None])`` for ``rows``: compact dtypes, what the model eats
    (:func:`take_inputs`)."""
    return take_inputs(arrays, rows, inputs), arrays.dose[rows][..., None]


def take_inputs(arrays, rows: np.ndarray, inputs: tuple[InputSpec, ...]) -> dict[str, np.ndarray]:
    """Each declared input (a model's ``spec.inputs``) of the patients at
    ``rows``, by fancy indexing: a volume from the ``arrays`` field of its name, a per-patient
    vector (prescriptions, beam angles) from ``arrays.vectors``, made once for the split by
    :func:`fit_vectors` (a :class:`ValueError` if it was not)."""
    taken = {}
    for spec in inputs:
        if spec.is_volume:
            source = getattr(arrays, spec.name)
        else:
            source = (getattr(arrays, "vectors", None) or {}).get(spec)
            if source is None:
                raise ValueError(f"Invalid `arrays`. Expected the model's per-patient input {spec.name!r} made once "
                                 f"for the split (data.batches.fit_vectors). Received: arrays without it")
        taken[spec.name] = source[rows]
    return taken


def fit_vectors(arrays, inputs: tuple[InputSpec, ...]):
    """``arrays`` with every per-patient vector input of ``inputs`` made for all its patients
    (:func:`patient_vectors`, which refuses a patient that does not fit the model, naming its
    file), in ``arrays.vectors`` by declaration: what :func:`take_inputs` then indexes like a
    volume. Once per split and model (training, prediction): a shallow copy, or ``arrays`` itself
    when it has them already or the model has none (OpenKBP's two volumes)."""
    have = getattr(arrays, "vectors", None) or {}
    missing = [spec for spec in inputs if not spec.is_volume and spec not in have]
    if not missing:
        return arrays
    fitted = copy.copy(arrays)
    fitted.vectors = {**have, **{spec: patient_vectors(arrays, spec) for spec in missing}}
    return fitted


def patient_vectors(arrays, spec: InputSpec) -> np.ndarray:
    """``(patients, spec.length)`` float32: the per-patient vector input ``spec`` of every patient
    of ``arrays``, from what their plan files say (``arrays``' field of the input's
    name, NaN for a patient without the file; see :func:`provided_code.data.split_arrays.plan_tables`).

    The one place a patient without its own file is given the run-wide value, ``spec.default``
    (the site's prescriptions, the run's gantry angles), as is every patient when ``arrays`` has
    no such field (or None there). Prescriptions: a patient's NaN columns take the default's.
    Angles: the patient's finite angles first, NaN after them (the field may be narrower or wider
    than ``spec.length``). A patient with more angles than the model's slots, or, with
    ``spec.all_slots``, fewer, is refused naming it and its ``beams.csv``.
    """
    rows = np.arange(arrays.ct.shape[0])
    default = np.asarray(spec.default, np.float32)
    given = getattr(arrays, spec.name, None)
    if spec.moves != ANGLES:
        if given is None:
            return np.tile(default, (len(rows), 1))
        given = np.asarray(given, np.float32)
        return np.where(np.isfinite(given), given, default).astype(np.float32)
    out = np.full((len(rows), spec.length), np.nan, np.float32)
    for n, row in enumerate(rows):
        values = np.asarray(given[row], np.float32) if given is not None else default[:0]
        values = values[np.isfinite(values)]
        own = values.size > 0
        if not own:
            values = default
        problem = None
        if len(values) > spec.length:
            problem = (f"{len(values)} beams; the model takes at most {spec.length} (the most any patient it was "
                       f"trained on had)")
        elif spec.all_slots and len(values) != spec.length:
            problem = (f"{len(values)} beams; the model makes one channel per beam (--beam-channels each) for "
                       f"exactly {spec.length}, so every patient needs that many")
        if problem:
            where = plan_file(arrays, row, BEAMS_FILE) if own else f"no {BEAMS_FILE} (the run-wide beams)"
            raise InputError(f"Patient {_patient_id(arrays, row)}: {where}: {problem}")
        out[n, :len(values)] = values
    return out


def plan_file(arrays, row: int, name: str) -> str:
    """Where the plan file ``name`` of the patient at ``row`` lives: in the split's folder when
    ``arrays`` knows it (``load_split``'s), else ``<patient>/<name>``."""
    folder = getattr(arrays, "folder", None)
    relative = f"{_patient_id(arrays, row)}/{name}"
    return str(Path(folder) / relative) if folder is not None else relative


def _patient_id(arrays, row: int) -> str:
    ids = getattr(arrays, "patient_ids", None)
    return ids[row] if ids is not None else f"#{row}"


_FILE_OF = {"prescriptions": PRESCRIPTIONS_FILE, "beam_angles": BEAMS_FILE}  # a per-patient input's plan file


def plan_files_not_taken(arrays, left_out: dict[str, str]) -> str | None:
    """The plan files of the patients of ``arrays`` that a model does not take (``left_out``: input
    name -> why, :meth:`provided_code.model_spec.ModelSpec.inputs_left_out`), said in one line: how many
    patients, the first one's file, and why; None when no patient has such a file."""
    carrying, first, whys = np.zeros(len(arrays.patient_ids), bool), None, []
    for name, why in left_out.items():
        table = getattr(arrays, name, None)
        if table is None:
            continue
        has = np.isfinite(np.asarray(table)).any(axis=1)
        if has.any():
            carrying |= has
            whys.append(f"{_FILE_OF[name]} as {why}")
            row = int(np.flatnonzero(has)[0])
            if first is None or row < first[0]:
                first = (row, name)
    if first is None:
        return None
    count = int(carrying.sum())
    return (f"the plan files of {count} patient{'s' if count > 1 else ''} (the first: "
            f"{plan_file(arrays, first[0], _FILE_OF[first[1]])}): {' and '.join(whys)}")


def warn_plan_files_not_taken(arrays, left_out: dict[str, str], model: str = "The model") -> None:
    """Log one warning when the patients of ``arrays`` have plan files ``model`` does not take
    (:func:`plan_files_not_taken`): they get the run-wide values instead. Once per split, by
    training (:func:`provided_code.training.feeds.fit_patient_inputs`) and by prediction."""
    found = plan_files_not_taken(arrays, left_out)
    if found is not None:
        logger.warning("%s does not take %s; those patients get the run-wide values", model, found)


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
