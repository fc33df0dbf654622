"""The physicist's tolerances a commissioned model is judged by (``openkbp-commission --tolerances
FILE``): per structure and DVH metric, how close to the plan the out-of-fold prediction must be
(``within_gy``) for how many of the patients (``fraction``). This module is their one home: the
file's format, the defaults (:data:`DEFAULTS`), and their check against a site.

**The file** is a CSV with the header ``structure,metric,within_gy,fraction``, one tolerance a row::

    structure,metric,within_gy,fraction
    organs,Dmean,3,0.9
    targets,D95,3,0.9
    PTV70,D95,2,0.95
    SpinalCord,D_0.1_cc,4,0.9

``structure`` is a structure of the model's site, or ``organs`` (every organ at risk of the site)
or ``targets`` (every target); a row naming a structure takes the place of its kind's row for that
metric. ``metric`` is one of the site's DVH metrics (OpenKBP: ``D_0.1_cc``, ``mean``, ``D_99``,
``D_95``, ``D_1``) or of the clinical table (``D99``, ``D95``, ``D50``, ``Dmean``, ``D1``,
``Dmax``): the metrics ``plans.csv`` holds. ``within_gy``: the largest |predicted − plan| (Gy) a
patient may have, 0 or more. ``fraction``: the share of the patients that must be within it, in
(0, 1] (0.9 for 90 %). Blank lines and lines starting with ``#`` are skipped; a byte-order mark is
fine; each structure-metric once.

**The defaults** (no ``--tolerances``): each organ's mean dose within 3 Gy of the plan for 90 % of
the patients, and each target's D95 within 3 Gy for 90 % (the clinical table's ``Dmean`` and
``D95``, which every site's structures have).

Pure Python: importing this imports neither TensorFlow nor Keras (the command line's ``--help``
reads :data:`DEFAULTS`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os
from pathlib import Path

from provided_code.errors import UserError
from provided_code.sites import CLINICAL_METRICS

HEADER = ("structure", "metric", "within_gy", "fraction")
KIND_WORDS = {"organs": "oar", "targets": "target"}  # a row for every structure of a kind


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """One row: ``structure`` (a site's structure, ``organs`` or ``targets``), ``metric``,
    ``within_gy`` and ``fraction``; ``line``: its line in the file (None for a default)."""
    structure: str
    metric: str
    within_gy: float
    fraction: float
    line: int | None = None

    def words(self) -> str:
        """``Dmean within 3 Gy of the plan for 90 % of patients``."""
        return f"{self.metric} within {self.within_gy:g} Gy of the plan for {100 * self.fraction:g} % of patients"

    def to_dict(self) -> dict:
        return {"structure": self.structure, "metric": self.metric, "within_gy": self.within_gy,
                "fraction": self.fraction}


DEFAULTS = (Tolerance("organs", "Dmean", 3.0, 0.9), Tolerance("targets", "D95", 3.0, 0.9))


def describe(tolerances=DEFAULTS) -> str:
    """The tolerances in words, as the command line's help and the report say them."""
    return "; ".join(f"{'each organ' if t.structure == 'organs' else 'each target' if t.structure == 'targets' else t.structure}'s "
                     f"{t.words()}" for t in tolerances)


class ToleranceError(UserError, ValueError):
    """A tolerance file that cannot be used: one line naming the file, the entry and the problem."""


def _refuse(source, line: int | None, expected: str, received: str):
    where = f"{source}" + (f", line {line}" if line is not None else "")
    raise ToleranceError(f"Invalid `tolerances`. Expected {expected}. Received: {where}: {received}")


def parse_tolerances(text: str, source: os.PathLike | str = "<tolerances>") -> tuple[Tolerance, ...]:
    """The tolerances of a file's ``text`` (module docstring), in its order; a
    :class:`ToleranceError` naming ``source`` and the line of the first bad entry. Structures and
    metrics are checked against a site by :func:`check_site`."""
    text = text.removeprefix("\ufeff")
    rows = [(number, row) for number, row in enumerate(csv.reader(io.StringIO(text)), start=1)
            if any(cell.strip() for cell in row) and not row[0].lstrip().startswith("#")]
    if not rows or tuple(cell.strip() for cell in rows[0][1]) != HEADER:
        _refuse(source, rows[0][0] if rows else None, f"the header {','.join(HEADER)}",
                repr(','.join(rows[0][1])) if rows else "an empty file")
    found, seen = [], {}
    for number, row in rows[1:]:
        entry = repr(",".join(row))
        if len(row) != len(HEADER):
            _refuse(source, number, f"{len(HEADER)} cells ({','.join(HEADER)}), e.g. targets,D95,3,0.9", entry)
        structure, metric = row[0].strip(), row[1].strip()
        if not structure or not metric:
            _refuse(source, number, "a structure and a metric, e.g. targets,D95,3,0.9", entry)
        within = _number(row[2])
        if within is None or within < 0:
            _refuse(source, number, "within_gy a tolerance in Gy, 0 or more (3 for 3 Gy)", entry)
        fraction = _number(row[3])
        if fraction is None or not 0 < fraction <= 1:
            _refuse(source, number, "fraction a share of the patients in (0, 1] (0.9 for 90 %)", entry)
        if (structure, metric) in seen:
            _refuse(source, number, "each structure-metric once", f"{entry}, as on line {seen[(structure, metric)]}")
        seen[(structure, metric)] = number
        found.append(Tolerance(structure, metric, within, fraction, number))
    if not found:
        _refuse(source, rows[0][0], "at least one tolerance under the header, e.g. targets,D95,3,0.9", "none")
    return tuple(found)


def _number(cell: str) -> float | None:
    try:
        value = float(cell.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def read_tolerances(path: os.PathLike | str) -> tuple[Tolerance, ...]:
    """The tolerances of the file at ``path`` (:func:`parse_tolerances`); one that cannot be read is
    a :class:`ToleranceError` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        _refuse(path, None, "a CSV file of tolerances (structure,metric,within_gy,fraction)", "no such file")
    except IsADirectoryError:
        _refuse(path, None, "a CSV file of tolerances (structure,metric,within_gy,fraction)", "a folder")
    except (OSError, UnicodeDecodeError) as error:
        _refuse(path, None, "a readable UTF-8 CSV file of tolerances", f"{type(error).__name__}: {error}")
    return parse_tolerances(text, path)


def check_site(tolerances, site, source: os.PathLike | str = "<tolerances>") -> None:
    """Every tolerance names a structure of ``site`` (or ``organs``, ``targets``) and a metric that
    structure has in its DVH table (its kind's own metrics and the clinical ones: an organ's
    ``D_95`` is no metric the site scores, and would never be judged); else a
    :class:`ToleranceError` naming the entry."""
    structures = set(site.names)
    kinds = {structure.name: structure.kind for structure in site.structures}
    metrics = list(dict.fromkeys((*site.metric_names, *CLINICAL_METRICS)))
    for tolerance in tolerances:
        if tolerance.structure not in structures and tolerance.structure not in KIND_WORDS:
            _refuse(source, tolerance.line, f"a structure of site {site.name} ({', '.join(site.names)}), organs or "
                                            f"targets", f"unknown structure {tolerance.structure!r}")
        if tolerance.metric not in metrics:
            _refuse(source, tolerance.line, f"a DVH metric ({', '.join(metrics)})",
                    f"unknown metric {tolerance.metric!r}")
        kind = KIND_WORDS.get(tolerance.structure) or kinds[tolerance.structure]
        own = list(dict.fromkeys((*site.metrics[kind], *CLINICAL_METRICS)))
        if tolerance.metric not in own:
            what = "targets" if kind == "target" else "organs at risk"
            whose = (tolerance.structure if tolerance.structure in KIND_WORDS else
                     f"{tolerance.structure} ({'a target' if kind == 'target' else 'an organ at risk'})")
            _refuse(source, tolerance.line, f"a DVH metric of {whose} on site {site.name} ({', '.join(own)})",
                    f"{tolerance.metric!r} for {tolerance.structure}, a metric the site does not compute for "
                    f"{what}")


def cells(tolerances, site) -> list[tuple[str, str, Tolerance]]:
    """``[(structure, metric, tolerance), ...]``: the structure-metrics the tolerances judge on
    ``site``, in the site's order of structures, then the tolerances' order of metrics; a row
    naming a structure takes the place of its kind's row for that metric."""
    kinds = {structure.name: structure.kind for structure in site.structures}
    chosen: dict[tuple[str, str], Tolerance] = {}
    for tolerance in tolerances:  # the kinds' rows first, so that a structure's own row replaces them
        if tolerance.structure in KIND_WORDS:
            for name, kind in kinds.items():
                if kind == KIND_WORDS[tolerance.structure]:
                    chosen[(name, tolerance.metric)] = tolerance
    for tolerance in tolerances:
        if tolerance.structure in kinds:
            chosen[(tolerance.structure, tolerance.metric)] = tolerance
    order = {name: k for k, name in enumerate(site.names)}
    metric_order = {t.metric: k for k, t in reversed(list(enumerate(tolerances)))}
    return [(structure, metric, tolerance) for (structure, metric), tolerance in
            sorted(chosen.items(), key=lambda item: (order[item[0][0]], metric_order[item[0][1]]))]
