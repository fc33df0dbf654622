"""A clinical DVH table: per structure the dose levels a physicist reads off a plan (Gy).

D99, D95 and D50 are the doses that 99 %, 95 % and 50 % of the structure's voxels receive at
least (the 1st, 5th and 50th percentiles), D1 the 99th percentile, Dmean the mean, Dmax the
maximum; numpy's linear interpolation, in float64, as the challenge's scores use.
"""

from __future__ import annotations

import csv
import io
import math
from typing import Iterable

import numpy as np

from provided_code.metrics.scoring import dvh_metrics, structure_indices
from provided_code.sites import CLINICAL_METRICS, Site  # noqa: F401 (the table's metric names; a site's goals name them too)

_PERCENTILES = (1.0, 5.0, 50.0)


def clinical_dvh(dose: np.ndarray, indices: list[np.ndarray], site: Site) -> dict[str, dict[str, float]]:
    """``{structure: {metric: Gy}}`` for every structure of ``site`` with voxels; ``indices`` as
    :func:`provided_code.metrics.scoring.structure_indices` gives them (flat, per structure)."""
    flat = np.asarray(dose, dtype=np.float64).reshape(-1)
    return clinical_dvh_of_values({name: flat[voxels] for name, voxels in zip(site.names, indices)})


def patient_table(dose: np.ndarray, structure_masks: np.ndarray, voxel_dimensions, site: Site) -> dict[str, dict[str, float]]:
    """``{structure: {metric: Gy}}`` of one 128³ dose for every structure of ``site`` with voxels:
    the site's metrics (the challenge's DVH score's, :func:`provided_code.metrics.scoring.dvh_metrics`)
    that apply to it, then the clinical ones; the metrics commissioning assesses (``plans.csv``)."""
    flat = np.asarray(dose, dtype=np.float64).reshape(-1)
    indices = structure_indices(structure_masks, len(site.names))
    metrics = dvh_metrics(lambda voxels: flat[voxels], indices, voxel_dimensions, site)
    clinical = clinical_dvh(flat, indices, site)
    return {name: {**{metric: float(metrics[k, m]) for m, metric in enumerate(site.metric_names)
                      if np.isfinite(metrics[k, m])}, **clinical[name]}
            for k, name in enumerate(site.names) if name in clinical}


def clinical_dvh_of_values(values: dict[str, np.ndarray]) -> dict[str, dict[str, float]]:
    """``{structure: {metric: Gy}}`` from each structure's voxel doses (all voxels of one size),
    in the order of ``values`` (the site's), for every structure with voxels."""
    table = {}
    for name in values:
        doses = np.asarray(values[name], dtype=np.float64)
        if doses.size == 0:
            continue
        d99, d95, d50 = np.percentile(doses, _PERCENTILES)
        table[name] = {"D99": float(d99), "D95": float(d95), "D50": float(d50), "Dmean": float(doses.mean()),
                       "D1": float(np.percentile(doses, 99.0)), "Dmax": float(doses.max())}
    return table


BAND_SOURCES = ("low", "high")  # the band's columns, beside each <metric>_predicted


def dvh_columns(metrics: Iterable[str], sources: Iterable[str], banded: bool) -> list[tuple[str, str]]:
    """``(metric, source)`` of each column of a DVH table (``<metric>_<source>``): per metric each
    source (``predicted``, ``reference``), the band's ``low`` and ``high`` right after ``predicted``."""
    sources = list(sources)
    columns = []
    for metric in metrics:
        for source in sources:
            columns.append((metric, source))
            if source == "predicted" and banded:
                columns += [(metric, bound) for bound in BAND_SOURCES]
    return columns


def dvh_cell(report: dict, structure: str, metric: str, source: str) -> str:
    """A DVH table's cell: ``report[source]``'s value (the band's for ``low``/``high``) to 0.001 Gy;
    empty where there is none."""
    table = report["band"][source] if source in BAND_SOURCES else report[source]
    value = table.get(structure, {}).get(metric)
    return "" if value is None or not math.isfinite(value) else f"{value:.3f}"


def dvh_csv_text(report: dict, metrics: Iterable[str]) -> str:
    """A DVH report (``predicted``, optionally ``band``, ``reference`` and ``volume_cc``, each
    ``{structure: ...}``) as CSV text: one row per predicted structure, its volume when the report
    has one, then each of ``metrics`` for each source (:func:`dvh_columns`, :func:`dvh_cell`)."""
    sources = [name for name in ("predicted", "reference") if name in report]
    columns = dvh_columns(metrics, sources, "band" in report)
    volume = "volume_cc" in report
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["structure", *(["volume_cc"] if volume else []), *[f"{m}_{s}" for m, s in columns]])
    for structure in report["predicted"]:
        writer.writerow([structure, *([f"{report['volume_cc'][structure]:.3f}"] if volume else []),
                         *[dvh_cell(report, structure, m, s) for m, s in columns]])
    return buffer.getvalue()
