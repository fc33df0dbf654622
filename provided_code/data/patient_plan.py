"""A patient's own plan: ``prescriptions.csv`` and ``beams.csv`` in the patient folder, each
optional, each overriding its site's (README, "A patient's own prescriptions and beams").

``prescriptions.csv``: header ``structure,dose_gy``; a row per target of the site (a target not
listed keeps the site's prescription).

``beams.csv``: header ``type,gantry_start,gantry_stop,direction,couch``; a row per beam. ``static``:
``gantry_start`` is the gantry angle in degrees, ``gantry_stop`` and ``direction`` empty. ``arc``:
from ``gantry_start`` to ``gantry_stop`` in ``direction`` ``CW`` or ``CC`` (DICOM's
GantryRotationDirection), sampled at the multiples of ``sites.ARC_STEP_DEGREES``. ``couch``: the
patient support angle in degrees (0: coplanar); the beam channels model every beam as coplanar.

Pure Python and numpy: read by the data layer, written by the DICOM cohort import.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

from provided_code.constants import BEAMS_FILE, PRESCRIPTIONS_FILE
from provided_code.data.errors import PatientDataError
from provided_code.infra.atomic import write_text_atomic
from provided_code.sites import DIRECTIONS, MAX_DOSE_GY, Arc, Beams, Site, is_gantry_angle

PRESCRIPTION_COLUMNS = ("structure", "dose_gy")
BEAM_COLUMNS = ("type", "gantry_start", "gantry_stop", "direction", "couch")


def read_plan(folder: os.PathLike | str, site: Site) -> tuple[dict[str, float] | None, tuple[float, ...] | None]:
    """``(prescriptions, gantry_angles)``: what the folder's own plan files say, each None without
    its file. ``prescriptions``: :func:`read_prescriptions` (the site's for a target the file does
    not list); ``gantry_angles``: the directions ``beams.csv`` delivers from (arcs sampled).
    What a patient read from its folder carries (``read_patient``, the DICOM import)."""
    prescriptions = read_prescriptions(folder, site) if (Path(folder) / PRESCRIPTIONS_FILE).is_file() else None
    beams = read_beams(folder)
    return prescriptions, None if beams is None else beams[0].gantry_angles()


def _rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict]]:
    """``(line number, {column: text})`` of each row under the header ``columns`` (a byte-order
    mark before it is fine, as in every CSV the package reads); a row of more or fewer fields than
    the header is refused, naming its line (an extra field would otherwise be dropped unread)."""
    try:
        reader = csv.reader(io.StringIO(path.read_text(encoding="utf-8-sig")))
        lines = [(reader.line_num, fields) for fields in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise PatientDataError(path.parent.name, path, f"unreadable ({error})") from None
    header = tuple(lines[0][1]) if lines else ()
    if header != columns:
        raise PatientDataError(path.parent.name, path, f"header must be {','.join(columns)}; found {','.join(header)}")
    rows = []
    for line, fields in lines[1:]:
        if not fields:  # an empty line
            continue
        if len(fields) != len(columns):
            raise PatientDataError(path.parent.name, path, f"line {line} has {len(fields)} fields; expected "
                                                           f"{len(columns)} ({','.join(columns)})")
        rows.append((line, dict(zip(columns, fields))))
    return rows


def _number(path: Path, line: int, column: str, text) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise PatientDataError(path.parent.name, path, f"line {line}: {column} {text!r} is not a finite number")
    return value


def _angle(path: Path, line: int, column: str, text) -> float:
    """A gantry or couch angle of ``beams.csv``: degrees in [0, 360) (:func:`~provided_code.sites.is_gantry_angle`)."""
    value = _number(path, line, column, text)
    if not is_gantry_angle(value):
        raise PatientDataError(path.parent.name, path, f"line {line}: {column} {text} is not a gantry angle in "
                                                       f"[0, 360) degrees")
    return value


def read_prescriptions(folder: os.PathLike | str, site: Site) -> dict[str, float]:
    """The patient's prescriptions (target → Gy): the site's, with those of ``prescriptions.csv``
    (if the folder has one) in their place."""
    prescriptions = dict(site.prescriptions_gy)
    path = Path(folder) / PRESCRIPTIONS_FILE
    if not path.exists():
        return prescriptions
    seen = set()
    for line, row in _rows(path, PRESCRIPTION_COLUMNS):
        name = row["structure"]
        if name not in prescriptions:
            raise PatientDataError(path.parent.name, path, f"line {line}: {name!r} is not a target of site {site.name} "
                                                           f"({', '.join(site.targets)})")
        if name in seen:
            raise PatientDataError(path.parent.name, path, f"line {line}: {name!r} is listed twice")
        seen.add(name)
        dose = _number(path, line, "dose_gy", row["dose_gy"])
        if dose <= 0:
            raise PatientDataError(path.parent.name, path, f"line {line}: dose_gy must be positive; found {dose:g}")
        if dose > MAX_DOSE_GY:
            raise PatientDataError(path.parent.name, path, f"line {line}: dose_gy {dose:g} is above {MAX_DOSE_GY:g} Gy "
                                                           f"(MAX_DOSE_GY): a dose in cGy?")
        prescriptions[name] = dose
    return prescriptions


def read_beams(folder: os.PathLike | str) -> tuple[Beams, tuple[float, ...]] | None:
    """``(beams, couch angles)`` from the folder's ``beams.csv``, None without one: of kind
    ``static`` for static beams only, ``arcs`` for arcs only. Static beams and arcs may be mixed:
    the result is then of kind ``static``, its angles the static beams' then the arcs' samples
    (duplicates dropped, order kept). Every angle is in [0, 360) degrees."""
    path = Path(folder) / BEAMS_FILE
    if not path.exists():
        return None
    static, arcs, couches = [], [], []
    rows = _rows(path, BEAM_COLUMNS)
    if not rows:
        raise PatientDataError(path.parent.name, path, "no beams (a header only)")
    for line, row in rows:
        kind = row["type"]
        start = _angle(path, line, "gantry_start", row["gantry_start"])
        couches.append(_angle(path, line, "couch", row["couch"] or 0))
        if kind == "static":
            if row["gantry_stop"] or row["direction"]:
                raise PatientDataError(path.parent.name, path, f"line {line}: a static beam has no gantry_stop or direction")
            static.append(start)
        elif kind == "arc":
            if row["direction"] not in DIRECTIONS:
                raise PatientDataError(path.parent.name, path,
                                       f"line {line}: direction must be CW or CC; found {row['direction']!r}")
            arcs.append(Arc(start, _angle(path, line, "gantry_stop", row["gantry_stop"]), row["direction"]))
        else:
            raise PatientDataError(path.parent.name, path, f"line {line}: type must be static or arc; found {kind!r}")
    beams = Beams("static", angles=tuple(static)) if not arcs else Beams("arcs", arcs=tuple(arcs))
    if arcs and static:  # mixed: the arcs' samples and the static angles
        beams = Beams("static", angles=tuple(dict.fromkeys([*static, *Beams("arcs", arcs=tuple(arcs)).gantry_angles()])))
    return beams, tuple(couches)


def write_prescriptions(folder: os.PathLike | str, prescriptions: dict[str, float]) -> Path:
    lines = [",".join(PRESCRIPTION_COLUMNS)] + [f"{name},{dose:.6g}" for name, dose in prescriptions.items()]
    path = Path(folder) / PRESCRIPTIONS_FILE
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def write_beams(folder: os.PathLike | str, beams: list[dict]) -> Path:
    """``beams``: dicts with the keys of ``BEAM_COLUMNS`` (``gantry_stop``, ``direction`` and
    ``couch`` may be left out of a static beam)."""
    def text(value) -> str:
        if not isinstance(value, float):
            return "" if value is None else str(value)
        written = f"{value:.6g}"
        return "0" if written == "360" else written  # an angle just under 360 (359.9999999) rounds to 360, which is 0

    lines = [",".join(BEAM_COLUMNS)]
    for beam in beams:
        values = [beam.get(column, "") for column in BEAM_COLUMNS]
        values[4] = beam.get("couch", 0)
        lines.append(",".join(text(v) for v in values))
    path = Path(folder) / BEAMS_FILE
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path
