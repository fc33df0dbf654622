"""The challenge's scores as a straightforward per-metric loop over pandas frames: the tests' oracle.

Slow (it parses every CSV and fills a DataFrame cell by cell); kept as the plain reading of the
definition that :mod:`provided_code.metrics.scoring` is tested against. It reads the CSVs with
pandas on its own, not with the package's reader, so that the comparison checks that reader too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from provided_code.constants import NUM_VOXELS
from provided_code.sites import openkbp

OARS = openkbp().oars
STRUCTURES = openkbp().names  # OpenKBP's channel order
TARGETS = openkbp().targets


def _volume(path: Path, mask: bool) -> np.ndarray:
    frame = pd.read_csv(path, index_col=0)
    volume = np.zeros(NUM_VOXELS)
    volume[frame.index.to_numpy()] = 1.0 if mask else frame["data"].to_numpy()
    return volume


def score_folders_loop(reference_dir: Path, prediction_dir: Path, patient_ids: list[str]) -> tuple[float, float]:
    """``(dose_score, dvh_score)`` of ``prediction_dir/pt_<N>.csv`` against ``reference_dir/pt_<N>/``."""
    columns = [(m, s) for m in ("D_0.1_cc", "mean") for s in OARS] + \
              [(m, s) for m in ("D_99", "D_95", "D_1") for s in TARGETS]
    reference_metrics = pd.DataFrame(index=patient_ids, columns=pd.MultiIndex.from_tuples(columns), dtype=float)
    predicted_metrics = reference_metrics.copy()
    dose_errors = []
    for pid in patient_ids:
        folder = Path(reference_dir) / pid
        reference = _volume(folder / "dose.csv", mask=False)
        predicted = _volume(Path(prediction_dir) / f"{pid}.csv", mask=False)
        possible_dose_mask = _volume(folder / "possible_dose_mask.csv", mask=True)
        voxel_volume = np.prod(np.loadtxt(folder / "voxel_dimensions.csv"))
        dose_errors.append(np.sum(np.abs(reference - predicted)) / np.sum(possible_dose_mask))
        voxels_in_tenth_cc = np.maximum(1, np.round(100 / voxel_volume))
        for structure in STRUCTURES:
            path = folder / f"{structure}.csv"
            if not path.exists():
                continue
            mask = _volume(path, mask=True).astype(bool)
            for table, dose in ((reference_metrics, reference), (predicted_metrics, predicted)):
                roi = dose[mask]
                if structure in OARS:
                    table.at[pid, ("D_0.1_cc", structure)] = np.percentile(roi, 100 - voxels_in_tenth_cc / len(roi) * 100)
                    table.at[pid, ("mean", structure)] = roi.mean()
                else:
                    table.at[pid, ("D_99", structure)] = np.percentile(roi, 1)
                    table.at[pid, ("D_95", structure)] = np.percentile(roi, 5)
                    table.at[pid, ("D_1", structure)] = np.percentile(roi, 99)
    dvh_score = np.nanmean(np.abs(reference_metrics - predicted_metrics).to_numpy(dtype=float))
    return float(np.mean(dose_errors)), float(dvh_score)
