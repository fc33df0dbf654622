"""``openkbp-score``'s folder work: a folder of ``pt_<N>.csv`` predictions read, checked against the
reference patients, and scored with :mod:`provided_code.metrics.scoring`."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path

import numpy as np

from provided_code.data.cache import load_split
from provided_code.data.csv_io import PatientDataError, as_volume, read_sparse_csv
from provided_code.infra.atomic import write_text_atomic
from provided_code.infra.progress import Progress, no_progress
from provided_code.metrics.scoring import Scores, score_split
from provided_code.sites import Site

logger = logging.getLogger(__name__)


def write_score_reports(scores: Scores, json_path: Path, csv_path: Path, extra: dict | None = None) -> None:
    """The scores' JSON summary (with ``extra`` entries, e.g. an ensemble's members) and their
    per-patient CSV, each written atomically."""
    write_text_atomic(Path(json_path), json.dumps({**scores.summary(), **(extra or {})}, indent=2) + "\n")
    buffer = io.StringIO()
    scores.per_patient().to_csv(buffer, index=False)
    write_text_atomic(Path(csv_path), buffer.getvalue())


def check_prediction_folder(folder: os.PathLike | str, patient_ids: list[str],
                            may_hold: list[str] = ()) -> Path:
    """``folder`` must hold exactly one ``pt_<N>.csv`` per patient (and may hold those of
    ``may_hold``, the reference's patients without a dose): names the missing and extra ones."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"Prediction folder {folder} does not exist.")
    found = {path.stem for path in folder.glob("pt_*.csv")}
    missing = [pid for pid in patient_ids if pid not in found]
    extra = sorted(found - set(patient_ids) - set(may_hold), key=lambda pid: (len(pid), pid))
    if missing or extra:
        problems = []
        if missing:
            problems.append("no prediction for " + ", ".join(missing)
                            + " (expected " + ", ".join(f"{pid}.csv" for pid in missing) + ")")
        if extra:
            problems.append("predictions for patients not in the reference: "
                            + ", ".join(f"{pid}.csv" for pid in extra))
        raise PatientDataError(", ".join(missing + extra), folder, "; ".join(problems))
    return folder


def read_prediction(folder: Path, patient_id: str) -> np.ndarray:
    """A flat float64 dose from ``folder/<patient_id>.csv``; a file with no voxels or with negative
    doses is scored as it is, with a warning naming the patient."""
    path = Path(folder) / f"{patient_id}.csv"
    indices, values = read_sparse_csv(path, patient_id, with_values=True)
    if indices.size == 0:
        logger.warning("Patient %s: %s lists no voxel (a header only): scored as zero dose everywhere",
                       patient_id, path)
    elif values.min() < 0:
        logger.warning("Patient %s: %s has %d negative doses (down to %.3g Gy): scored as they are",
                       patient_id, path, int(np.count_nonzero(values < 0)), float(values.min()))
    return as_volume(indices, values, np.float64)


class SparseDoses(dict):
    """Doses by row, kept as their non-zero voxels (float64, as read: about a twentieth of a dense
    128³ volume, so 200 patients fit in under a gigabyte) and given back as flat 128³ volumes."""

    def __setitem__(self, row: int, dose: np.ndarray) -> None:
        flat = np.asarray(dose, np.float64).reshape(-1)
        voxels = np.flatnonzero(flat)
        super().__setitem__(row, (voxels, flat[voxels]))

    def __getitem__(self, row: int) -> np.ndarray:
        voxels, values = super().__getitem__(row)
        return as_volume(voxels, values, np.float64)


def reference_rows(arrays, split: os.PathLike | str) -> np.ndarray:
    """The rows of the patients of ``arrays`` that have a reference dose; when only some have one,
    a warning says how many and names the others. None: a :class:`PatientDataError`."""
    rows = np.flatnonzero(arrays.has_dose)
    if rows.size == 0:
        raise PatientDataError("(all)", split, "no patient has a reference dose.csv: nothing to score against")
    if rows.size < len(arrays):
        without = [pid for pid, has in zip(arrays.patient_ids, arrays.has_dose) if not has]
        logger.warning("Only %d of %d patients of %s have a reference dose.csv: scoring those %d; no reference "
                       "for %s", rows.size, len(arrays), split, rows.size, ", ".join(without))
    return rows


def score_prediction_folder(reference_dir: os.PathLike | str, prediction_dir: os.PathLike | str,
                            cache_dir: os.PathLike | str | None = None, progress: Progress = no_progress, *,
                            site: Site) -> Scores:
    """Score every ``prediction_dir/pt_<N>.csv`` against the patients of ``reference_dir`` (data of
    ``site``) that have a reference dose (when only some have one, those, with a warning)."""
    arrays = load_split(reference_dir, cache_dir=cache_dir, require_dose=False, progress=progress, site=site)
    rows = reference_rows(arrays, reference_dir)
    scored = [arrays.patient_ids[row] for row in rows]
    folder = check_prediction_folder(prediction_dir, scored,
                                     may_hold=[pid for pid in arrays.patient_ids if pid not in scored])
    return score_split(arrays, lambda row: read_prediction(folder, arrays.patient_ids[row]), progress, rows=rows)
