"""The OpenKBP challenge's dose score and DVH score, vectorised, for any site.

Dose score: per patient, the sum of |reference − predicted| over all voxels divided by the number
of voxels in the possible-dose mask; averaged over patients. DVH score: for every organ at risk
the site's organ metrics, for every target its target metrics (OpenKBP's and the default: D_0.1cc
and mean dose; D99, D95 and D1); the mean absolute difference between
reference and prediction over every (patient, structure, metric) entry that exists (a structure
missing from a patient is left out). D_0.1cc is the percentile 100 − v/n·100 of the structure's
doses, v = max(1, round(100 / voxel volume in mm³)), n its voxel count; D99, D95 and D1 are the
1st, 5th and 99th percentiles; numpy's linear interpolation throughout, in float64. In a site
file, ``D_<v>_cc`` is the dose to the hottest v cc (v/n·100 read as above with v × 1000 mm³),
``D_<p>`` the dose that p % of the volume receives (the percentile 100 − p), ``mean`` the mean.

A structure no larger than its ``D_<v>_cc`` volume (n ≤ v voxels: 1 or 2 voxels for D_0.1cc at
OpenKBP's 3.9 × 3.9 × 2.5 mm) has the percentile 0, its least dose: the hottest v cc then hold
the whole structure, and the dose they all receive at least is its minimum. The challenge's own
evaluator (``provided_code/dose_evaluation_class.py`` of github.com/ababier/open-kbp, to its
2024 version) computes the same formula unclipped and so asks numpy for a negative percentile,
which raises: it defines no value there (no challenge patient had such a structure), and the
percentile 0 is the one that continues its formula (at n = v it gives 0). Every value it does
define is unchanged.

A patient's metrics are a ``(len(site.names), len(site.metric_names))`` table, NaN where a metric
does not apply to the structure or the structure is absent.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from provided_code.data.csv_io import exact_dose
from provided_code.infra.progress import Progress, no_progress
from provided_code.sites import Site, parse_metric

logger = logging.getLogger(__name__)


def structure_indices(structure_masks: np.ndarray, count: int) -> list[np.ndarray]:
    """Flat voxel indices of each of the site's ``count`` structures (empty where absent), from
    the packed bitfield."""
    flat = structure_masks.reshape(-1)
    inside = np.flatnonzero(flat)
    bits = flat[inside]
    return [inside[(bits >> k) & 1 == 1] for k in range(count)]


@dataclasses.dataclass(frozen=True)
class MetricColumns:
    """Where each metric of one kind of structure goes in a patient's table, resolved once per
    site (:func:`metric_columns`): ``mean`` columns; ``(column, cc)`` of the ``D_<cc>_cc``
    metrics; the ``D_<p>`` metrics' columns and the percentiles ``100 - p`` (one np.percentile call)."""

    mean: tuple[int, ...]
    cc: tuple[tuple[int, float], ...]
    percent: tuple[int, ...]
    percentiles: tuple[float, ...]


def metric_columns(site: Site) -> dict[str, MetricColumns]:
    """Each kind's :class:`MetricColumns`: the site's metric names read once
    (:func:`provided_code.sites.parse_metric`), not per patient."""
    columns = site.metric_names
    resolved = {}
    for kind, names in site.metrics.items():
        mean, cc, percent, percentiles = [], [], [], []
        for name in names:
            measure, amount = parse_metric(name)
            if measure == "mean":
                mean.append(columns.index(name))
            elif measure == "cc":
                cc.append((columns.index(name), amount))
            else:
                percent.append(columns.index(name))
                percentiles.append(100.0 - amount)
        resolved[kind] = MetricColumns(tuple(mean), tuple(cc), tuple(percent), tuple(percentiles))
    return resolved


def dvh_metrics(dose_at: Callable[[np.ndarray], np.ndarray], indices: list[np.ndarray],
                voxel_dimensions: np.ndarray, site: Site,
                columns: dict[str, MetricColumns] | None = None) -> np.ndarray:
    """The metric table of one dose; ``dose_at(flat_indices)`` gives its float64 values there.
    ``columns``: :func:`metric_columns` of ``site`` (resolved here if not given)."""
    columns = metric_columns(site) if columns is None else columns
    voxel_volume = np.prod(voxel_dimensions)  # mm³
    table = np.full((len(site.names), len(site.metric_names)), np.nan)
    for k, (structure, voxels) in enumerate(zip(site.structures, indices)):
        if voxels.size == 0:
            continue
        roi = dose_at(voxels)
        kind = columns[structure.kind]
        for column in kind.mean:
            table[k, column] = roi.mean()
        for column, amount in kind.cc:
            voxels_in_volume = max(1.0, float(np.round(amount * 1000.0 / voxel_volume)))
            # a structure of at most that many voxels: its least dose (see the module docstring)
            table[k, column] = np.percentile(roi, max(0.0, 100.0 - voxels_in_volume / roi.size * 100.0))
        if kind.percent:  # one np.percentile call for the kind's volume-percent metrics
            table[k, list(kind.percent)] = np.percentile(roi, list(kind.percentiles))
    return table


@dataclasses.dataclass
class Scores:
    patient_ids: list[str]
    dose_errors: np.ndarray  # (P,) Gy
    reference: np.ndarray  # (P, structures, metrics) Gy, NaN where absent
    predicted: np.ndarray  # same
    site: Site  # the structures and metrics of the tables
    without_reference: list[str] = dataclasses.field(default_factory=list)  # the split's patients left out: no dose

    @property
    def dose_score(self) -> float:
        return float(np.mean(self.dose_errors))

    @property
    def differences(self) -> np.ndarray:
        return np.abs(self.reference - self.predicted)

    @property
    def dvh_score(self) -> float:
        return float(np.nanmean(self.differences))

    def summary(self) -> dict:
        differences = self.differences
        with warnings.catch_warnings():  # a structure absent in every patient has an empty mean
            warnings.simplefilter("ignore", RuntimeWarning)
            by_structure = np.nanmean(differences, axis=(0, 2))
            by_metric = np.nanmean(differences, axis=(0, 1))
        summary = {
            "dose_score": self.dose_score,
            "dvh_score": self.dvh_score,
            "patients": len(self.patient_ids),
            "dvh_by_structure": {name: _number(value) for name, value in zip(self.site.names, by_structure)},
            "dvh_by_metric": {name: _number(value) for name, value in zip(self.site.metric_names, by_metric)},
        }
        if self.without_reference:
            summary["patients_without_reference_dose"] = list(self.without_reference)
        return summary

    def per_patient(self) -> pd.DataFrame:
        """One row per patient: dose error, and each metric's reference, predicted and difference."""
        columns = {"patient_id": self.patient_ids, "dose_error": self.dose_errors}
        for k, entry in enumerate(self.site.structures):
            structure = entry.name
            for metric in self.site.metrics[entry.kind]:
                m = self.site.metric_names.index(metric)
                columns[f"{structure}_{metric}_reference"] = self.reference[:, k, m]
                columns[f"{structure}_{metric}_predicted"] = self.predicted[:, k, m]
                columns[f"{structure}_{metric}_difference"] = self.predicted[:, k, m] - self.reference[:, k, m]
        return pd.DataFrame(columns)



def _number(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def score_split(arrays, predicted: Callable[[int], np.ndarray], progress: Progress = no_progress,
                rows: Sequence[int] | None = None) -> Scores:
    """Scores of ``predicted(row)`` (a 128³ dose, any float dtype) against each reference of ``arrays``.

    ``arrays`` is a 128³ :class:`~provided_code.data.split_arrays.SplitArrays` with reference doses; they
    are restored to the CSV's exact float64 values before scoring. One patient at a time.
    ``rows``: score only these patients (e.g. those with reference doses); the others are listed
    in ``Scores.without_reference``. A prediction that is non-zero outside the possible-dose mask
    counts there, as in the challenge, with a warning naming the patient and the voxel count.
    """
    rows = list(range(len(arrays))) if rows is None else [int(row) for row in rows]
    missing = [arrays.patient_ids[row] for row in rows if not arrays.has_dose[row]]
    if missing:
        raise ValueError(f"Cannot score: no reference dose.csv for {', '.join(missing)}")
    count = len(rows)
    errors = np.empty(count)
    site = arrays.site
    reference_tables = np.empty((count, len(site.names), len(site.metric_names)))
    predicted_tables = np.empty_like(reference_tables)
    columns = metric_columns(site)
    for slot, row in enumerate(progress(rows, count, "Scoring")):
        reference32 = arrays.dose[row].reshape(-1)
        decimals = int(arrays.dose_decimals[row])
        prediction = np.asarray(predicted(row)).reshape(-1)
        # Work on the voxels that matter: the reference is zero outside the possible-dose mask
        # (checked when the data is read, and again here), so the dose error is the sum over the
        # mask plus |prediction| outside it.
        inside = np.flatnonzero(arrays.possible_dose_mask[row])
        reference_inside = exact_dose(reference32[inside], decimals)
        if np.count_nonzero(reference_inside) != np.count_nonzero(reference32):
            raise ValueError(f"Patient {arrays.patient_ids[row]}: the reference dose is non-zero outside "
                             f"its possible-dose mask")
        prediction_inside = prediction[inside].astype(np.float64)
        outside = 0.0
        outside_voxels = np.count_nonzero(prediction) - np.count_nonzero(prediction_inside)
        if outside_voxels:
            outside = np.abs(prediction[~arrays.possible_dose_mask[row].reshape(-1)]).sum(dtype=np.float64)
            logger.warning("Patient %s: the prediction is non-zero in %d voxel(s) outside the possible-dose mask "
                           "(%.4g Gy in all); the dose score counts them, as the challenge's does",
                           arrays.patient_ids[row], outside_voxels, outside)
        errors[slot] = (np.abs(reference_inside - prediction_inside).sum() + outside) / inside.size
        indices = structure_indices(arrays.structure_masks[row], len(site.names))
        reference_tables[slot] = dvh_metrics(lambda v: exact_dose(reference32[v], decimals), indices,
                                             arrays.voxel_dimensions[row], site, columns)
        predicted_tables[slot] = dvh_metrics(lambda v: prediction[v].astype(np.float64), indices,
                                             arrays.voxel_dimensions[row], site, columns)
    chosen = set(rows)
    return Scores([arrays.patient_ids[row] for row in rows], errors, reference_tables, predicted_tables, site=site,
                  without_reference=[pid for row, pid in enumerate(arrays.patient_ids) if row not in chosen])
