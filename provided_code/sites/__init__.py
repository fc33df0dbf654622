"""Treatment sites: which structures a model sees, in which channel order, at which prescriptions,
which of them a left-right flip swaps, the DICOM names they are matched from, the DVH metrics they
are scored by, and the beams a plan of the site is delivered with; and, apart from what a model is
(:meth:`Site.same_as` ignores them), the clinical goals commissioning holds its plans to and the
plausible ceiling of a predicted dose.

A site is data: a JSON file (README, "Treatment sites"). Two are shipped beside this module:
``openkbp`` (the challenge's head and neck, today's behaviour exactly) and ``prostate``.
:func:`load_site` takes a shipped name or a path to a site file; :class:`Site` is what every
module that needs a structure list, a prescription, a mirror pair or a name table asks.

Pure Python and numpy: importing this imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from pathlib import Path

import numpy as np

from provided_code.constants import PATIENT_FILES
from provided_code.errors import UserError

SITE_FORMAT = 1
SHIPPED = ("openkbp", "prostate")
HERE = Path(__file__).resolve().parent
KINDS = ("oar", "target")
MAX_STRUCTURES = 32  # bits of the widest packing (uint32); 16 or fewer stay uint16
ARC_STEP_DEGREES = 10.0  # an arc is sampled at the gantry angles that are multiples of this within its span
GRID_SHAPES = ((128, 128, 128),)  # the grid every layer of this version works on
SLICE_PLACEMENTS = ("targets",)  # how the DICOM import places the box along the slice axis
# The clinical DVH table's metrics (provided_code.metrics.dvh_table computes them); a goal may name them.
CLINICAL_METRICS = ("D99", "D95", "D50", "Dmean", "D1", "Dmax")
DIRECTIONS = ("CW", "CC")  # DICOM GantryRotationDirection: clockwise (angles increase), counter-clockwise
# The largest volume a D_<cc>_cc metric may name: 10 litres, more than any organ or target a plan
# is scored on holds (both lungs together hold about 6 L at a full breath), and an eighth of the
# whole 128³ grid at OpenKBP's 3.9 × 3.9 × 2.5 mm voxels (80 L). A larger one is a slip of units
# (mm³ written for cc) that would score every structure by its least dose.
MAX_METRIC_CC = 10_000.0
# The highest dose a prescription may state, in a site file or a patient's prescriptions.csv:
# above any course of external-beam radiotherapy (the escalated prostate arms stop near 80 Gy) and
# far below the same dose in cGy (7000 for 70 Gy), the slip it is there to catch.
MAX_DOSE_GY = 150.0
# A predicted dose above this many times the site's highest prescription is one no plan gives (a badly
# trained model predicted up to 860 Gy for a 70 Gy site): a warning on every path to a prediction
# (provided_code.metrics.ceiling). A site file's dose_ceiling_gy sets the ceiling in Gy instead.
DOSE_CEILING_FACTOR = 1.3
MAX_DOSE_CEILING_GY = 2 * MAX_DOSE_GY  # a higher dose_ceiling_gy would be a slip of units (cGy)


def is_gantry_angle(value: float) -> bool:
    """A gantry (or couch) angle as DICOM and the plan files state it: degrees in [0, 360). 361 is
    not 1°, and an arc of 0 to 720 is not a turn: such a figure is a slip, refused where it is read."""
    return 0.0 <= value < 360.0
_METRIC = re.compile(r"^(mean|D_(\d+(?:\.\d+)?)(_cc)?)$")


def parse_metric(name: str) -> tuple[str, float]:
    """A DVH metric's name read: ``"mean"`` → ``("mean", 0.0)``; ``"D_0.1_cc"`` → ``("cc", 0.1)``
    (the dose to the hottest 0.1 cc); ``"D_95"`` → ``("percent", 95.0)`` (the dose 95 % of the
    volume receives). A :class:`ValueError` for any other name. The one reading of the grammar:
    site files are checked with it, :mod:`provided_code.metrics.scoring` computes by it."""
    found = _METRIC.match(name) if isinstance(name, str) else None
    if found is None:
        raise ValueError(f"Invalid metric {name!r}. Expected mean, D_<percent of volume> (D_95) or D_<cc>_cc "
                         f"(D_0.1_cc)")
    if found.group(2) is None:
        return "mean", 0.0
    return ("cc" if found.group(3) else "percent"), float(found.group(2))


class SiteError(UserError, ValueError):
    """A site file or site description is not valid: one line naming the file and the field."""

    def __init__(self, source, field: str, problem: str):
        self.source, self.field, self.problem = str(source), field, problem
        super().__init__(f"{source}: invalid `{field}`: {problem}")


@dataclasses.dataclass(frozen=True)
class Structure:
    name: str
    kind: str  # "oar" or "target"
    prescription_gy: float | None  # targets only
    dicom_names: tuple[str, ...]
    required: bool = True  # targets: every patient of the site has it (False: a patient may lack it)


@dataclasses.dataclass(frozen=True)
class Arc:
    start: float  # gantry degrees
    stop: float
    direction: str  # "CW" (angles increase from start to stop) or "CC"

    def angles(self, step: float = ARC_STEP_DEGREES) -> tuple[float, ...]:
        """The multiples of ``step`` the arc passes over, in delivery order (start and stop included
        when they are multiples). A start equal to its stop is a full turn."""
        span = (self.stop - self.start) % 360.0 if self.direction == "CW" else (self.start - self.stop) % 360.0
        span = 360.0 if span == 0 else span

        def travelled(angle):  # degrees from the start, in the arc's direction
            return (angle - self.start) % 360.0 if self.direction == "CW" else (self.start - angle) % 360.0

        multiples = [k * step for k in range(int(round(360.0 / step)))]
        return tuple(float(a) for a in sorted((a for a in multiples if travelled(a) <= span + 1e-9), key=travelled))


@dataclasses.dataclass(frozen=True)
class Beams:
    """A plan's beam arrangement: static gantry angles, arcs, or none."""

    kind: str  # "static", "arcs" or "none"
    angles: tuple[float, ...] = ()  # static
    arcs: tuple[Arc, ...] = ()

    def gantry_angles(self, step: float = ARC_STEP_DEGREES) -> tuple[float, ...]:
        """Every direction the beams come from, degrees in [0, 360): the static angles, or each
        arc's samples (:meth:`Arc.angles`); exact repeats left out, first occurrence kept."""
        if self.kind == "static":
            found = [float(a) % 360.0 for a in self.angles]
        else:
            found = [a for arc in self.arcs for a in arc.angles(step)]
        return tuple(dict.fromkeys(found))

    def to_dict(self) -> dict:
        if self.kind == "static":
            return {"type": "static", "angles": [_plain(a) for a in self.angles]}
        if self.kind == "arcs":
            return {"type": "arcs", "arcs": [{"start": _plain(a.start), "stop": _plain(a.stop),
                                              "direction": a.direction} for a in self.arcs]}
        return {"type": "none"}


@dataclasses.dataclass(frozen=True)
class Goal:
    """A clinical goal a site's plans are held to (commissioning reads it; not part of what a
    model is): ``structure``'s ``metric`` (the site's metric of the structure's kind, or a clinical
    one, :data:`CLINICAL_METRICS`) at most ``max_gy`` or at least ``min_gy`` (exactly one)."""

    structure: str
    metric: str
    max_gy: float | None = None
    min_gy: float | None = None

    @property
    def bound(self) -> tuple[str, float]:
        """``("max_gy", Gy)`` or ``("min_gy", Gy)``: the goal's one bound."""
        return ("max_gy", self.max_gy) if self.max_gy is not None else ("min_gy", self.min_gy)

    def met_by(self, gy: float) -> bool:
        """Whether a value meets the goal (one exactly at the bound does)."""
        key, value = self.bound
        return gy <= value if key == "max_gy" else gy >= value

    def to_dict(self) -> dict:
        key, value = self.bound
        return {"structure": self.structure, "metric": self.metric, key: _plain(value)}

    def __str__(self) -> str:
        key, value = self.bound
        return f"{self.structure} {self.metric} {'≤' if key == 'max_gy' else '≥'} {_plain(value)} Gy"


@dataclasses.dataclass(frozen=True)
class Site:
    name: str
    description: str
    structures: tuple[Structure, ...]
    mirror_pairs: tuple[tuple[str, str], ...]  # (right, left): what a left-right flip swaps
    body_names: tuple[str, ...]  # DICOM names of the body outline, which becomes the possible-dose mask
    metrics: dict  # {"oar": (...), "target": (...)}: the DVH metrics each kind is scored by
    grid: dict  # {"shape": (128, 128, 128), "slices": "targets"}
    beams: Beams
    goals: tuple[Goal, ...] = ()  # clinical goals (commissioning); not part of what a model is: see same_as
    dose_ceiling: float | None = None  # the site file's dose_ceiling_gy (None: the default); not part of a model

    # -- what the rest of the package asks ------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        """The structures in channel order: bit k of a packed ``structure_masks`` volume is names[k]."""
        return tuple(s.name for s in self.structures)

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.structures if s.kind == "target")

    @property
    def required_targets(self) -> tuple[str, ...]:
        """The targets every patient of the site has: an import refuses a patient without one."""
        return tuple(s.name for s in self.structures if s.kind == "target" and s.required)

    @property
    def oars(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.structures if s.kind == "oar")

    @property
    def prescriptions_gy(self) -> dict[str, float]:
        return {s.name: s.prescription_gy for s in self.structures if s.kind == "target"}

    @property
    def max_prescription_gy(self) -> float:
        return max(self.prescriptions_gy.values())

    @property
    def dose_ceiling_gy(self) -> float:
        """The plausible ceiling of a predicted dose (Gy): the site file's ``dose_ceiling_gy``, else
        :data:`DOSE_CEILING_FACTOR` times the highest prescription."""
        return self.dose_ceiling if self.dose_ceiling is not None else DOSE_CEILING_FACTOR * self.max_prescription_gy

    @property
    def dose_ceiling_said(self) -> str:
        """Where :attr:`dose_ceiling_gy` comes from, in words."""
        if self.dose_ceiling is not None:
            return f"the site {self.name}'s dose_ceiling_gy"
        highest = _plain(self.max_prescription_gy)
        return f"{DOSE_CEILING_FACTOR:g} × the site {self.name}'s highest prescription, {highest} Gy"

    @property
    def volume_shape(self) -> tuple[int, int, int]:
        return tuple(self.grid["shape"])

    def bit(self, name: str) -> int:
        return 1 << self.names.index(name)

    @property
    def mask_dtype(self) -> np.dtype:
        """The packed ``structure_masks`` dtype (:func:`mask_dtype_for` its structure count)."""
        return mask_dtype_for(len(self.structures))

    @property
    def target_bits(self) -> int:
        """A voxel in any target has one of these bits."""
        return sum(self.bit(name) for name in self.targets)

    @property
    def mirror_bits(self) -> tuple[tuple[int, int], ...]:
        return tuple((self.bit(right), self.bit(left)) for right, left in self.mirror_pairs)

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The columns of a patient's DVH table: the organs' metrics, then the targets' (each once)."""
        return tuple(dict.fromkeys((*self.metrics["oar"], *self.metrics["target"])))

    def structure_files(self) -> tuple[str, ...]:
        return tuple(f"{name}.csv" for name in self.names)

    def to_dict(self) -> dict:
        """The site as its file says it (``site_from_dict(site.to_dict())`` gives it back)."""
        structures = []
        for s in self.structures:
            entry = {"name": s.name, "kind": s.kind}
            if s.kind == "target":
                entry["prescription_gy"] = _plain(s.prescription_gy)
            entry["dicom_names"] = list(s.dicom_names)
            if not s.required:
                entry["required"] = False
            structures.append(entry)
        return {"format": SITE_FORMAT, "name": self.name, "description": self.description, "structures": structures,
                "mirror_pairs": [list(pair) for pair in self.mirror_pairs], "body": {"dicom_names": list(self.body_names)},
                "metrics": {kind: list(names) for kind, names in self.metrics.items()},
                "grid": {"shape": list(self.grid["shape"]), "slices": self.grid["slices"]},
                "beams": self.beams.to_dict(), **self._goals_dict(),
                **({"dose_ceiling_gy": _plain(self.dose_ceiling)} if self.dose_ceiling is not None else {})}

    def _goals_dict(self) -> dict:
        """``{"goals": [...]}`` when the site has goals, else nothing (a site without writes none)."""
        return {"goals": [goal.to_dict() for goal in self.goals]} if self.goals else {}

    def model_dict(self) -> dict:
        """:meth:`to_dict` without ``goals``, ``dose_ceiling_gy`` and which targets a patient may lack
        (``required``): what a model, a cache and a data folder of the site share. Goals and the
        ceiling are the clinic's judgement of plans and predictions, and ``required`` only what the
        DICOM import asks of a patient; none is part of what a model is."""
        facts = {key: value for key, value in self.to_dict().items() if key not in ("goals", "dose_ceiling_gy")}
        for entry in facts["structures"]:
            entry.pop("required", None)
        return facts

    def same_as(self, other: "Site") -> bool:
        """Whether a model, a cache or a data folder of one site is of the other: :meth:`model_dict`
        (so one saved before goals or optional targets existed, or with other ones, is of the same site)."""
        return self.model_dict() == other.model_dict()

    def __str__(self) -> str:
        return self.name


def _plain(value: float):
    """72.0 -> 72 in the JSON a site writes; other floats as they are."""
    return int(value) if float(value).is_integer() else float(value)


@functools.lru_cache(maxsize=None)
def _shipped(name: str) -> Site:
    path = HERE / f"{name}.json"
    return site_from_dict(json.loads(path.read_text()), path)


def openkbp() -> Site:
    """The OpenKBP challenge's site: what every model and cache written before sites existed is."""
    return _shipped("openkbp")


def load_site(spec: "str | os.PathLike | Site | dict") -> Site:
    """A site from a shipped name (``openkbp``, ``prostate``), a path to a site file, a site's
    dictionary (as ``config.json`` holds it) or a :class:`Site`. Which site is the caller's to say
    (a command line's ``--site``, a model's config): there is no default."""
    if spec is None:
        raise TypeError("Invalid `spec`. Expected a site's name, file, dictionary or Site. Received: spec=None")
    if isinstance(spec, Site):
        return spec
    if isinstance(spec, dict):
        site = site_from_dict(spec, "config.json `site`")
        # A shipped site saved in a model's config or a cache before a field that changes no model
        # existed (a target's ``required``): today's shipped site, so that what the field says holds
        # for the models trained before it too.
        return _shipped(site.name) if site.name in SHIPPED and site.same_as(_shipped(site.name)) else site
    text = str(spec)
    if text in SHIPPED:
        return _shipped(text)
    path = Path(text)
    if not path.suffix and not path.exists():
        raise SiteError("--site", "site", f"expected {', '.join(SHIPPED)} or a site file (.json). Received: {text!r}")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SiteError(path, "site", "the site file does not exist") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SiteError(path, "site", f"not a JSON file ({error})") from None
    site = site_from_dict(data, path)
    if site.name in SHIPPED and not site.same_as(_shipped(site.name)):
        raise SiteError(path, "name", f"{site.name!r} is a shipped site's name and this file differs from it; give "
                                      f"your site a name of its own")
    return site


def mask_dtype_for(structures: int) -> np.dtype:
    """The dtype that packs ``structures`` bits, one per structure: uint16 up to 16, else uint32."""
    return np.dtype(np.uint16) if structures <= 16 else np.dtype(np.uint32)


def normalise_name(name: str) -> str:
    """``'Parotid_L '`` → ``'parotidl'``: how ROI names are compared (lower case, letters and digits only)."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def site_from_dict(data, source) -> Site:
    """The :class:`Site` a site file's contents describe; :class:`SiteError` naming ``source`` and
    the field for the first thing wrong."""
    def fail(field, problem):
        raise SiteError(source, field, problem)

    if not isinstance(data, dict):
        fail("site", "expected a JSON object")
    known = {"format", "name", "description", "structures", "mirror_pairs", "body", "metrics", "grid", "beams", "goals",
             "dose_ceiling_gy"}
    for key in data:
        if key not in known:
            fail(key, f"unknown field; expected one of {', '.join(sorted(known))}")
    for key in ("name", "structures", "beams"):  # the others have documented defaults (README)
        if key not in data:
            hint = ' (say {"type": "none"} for a site without beam channels)' if key == "beams" else ""
            fail(key, f"missing{hint}")
    if data.get("format", SITE_FORMAT) != SITE_FORMAT:
        fail("format", f"expected {SITE_FORMAT}. Received: {data.get('format')!r}")
    name = data["name"]
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        fail("name", f"expected letters, digits, '_', '.' or '-'. Received: {name!r}")
    description = data.get("description", "")
    if not isinstance(description, str):
        fail("description", "expected a string")

    entries = data["structures"]
    if not isinstance(entries, list) or not entries:
        fail("structures", "expected a non-empty list of structures")
    if len(entries) > MAX_STRUCTURES:
        fail("structures", f"{len(entries)} structures; at most {MAX_STRUCTURES} (one bit each in a uint32)")
    structures, seen = [], set()
    for k, entry in enumerate(entries):
        field = f"structures[{k}]"
        if not isinstance(entry, dict):
            fail(field, "expected an object with name, kind and dicom_names")
        for key in entry:
            if key not in ("name", "kind", "prescription_gy", "dicom_names", "required"):
                fail(f"{field}.{key}", "unknown field; expected name, kind, prescription_gy, dicom_names, required")
        for key in ("name", "kind"):
            if key not in entry:
                fail(f"{field}.{key}", "missing")
        sname = entry["name"]
        if not isinstance(sname, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", sname):
            fail(f"{field}.name", f"expected letters, digits, '_', '.' or '-' (it names a CSV file). Received: {sname!r}")
        taken = {name.lower(): name for name in PATIENT_FILES}.get(f"{sname}.csv".lower())
        if taken is not None:  # (compared without case: Dose.csv is dose.csv where file names are, macOS, Windows)
            fail(f"{field}.name", f"{sname!r} would be stored as {taken}, a file every patient folder has for "
                                  f"itself; name the structure otherwise")
        if sname in seen:
            fail(f"{field}.name", f"duplicate structure {sname!r}")
        seen.add(sname)
        kind = entry["kind"]
        if kind not in KINDS:
            fail(f"{field}.kind", f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
        prescription = entry.get("prescription_gy")
        if kind == "target":
            if prescription is None:
                fail(f"{field}.prescription_gy", f"target {sname!r} has no prescription (Gy)")
            if isinstance(prescription, bool) or not isinstance(prescription, (int, float)) \
                    or not math.isfinite(prescription) or prescription <= 0:
                fail(f"{field}.prescription_gy", f"expected a positive number of Gy. Received: {prescription!r}")
            if prescription > MAX_DOSE_GY:
                fail(f"{field}.prescription_gy", f"expected at most {MAX_DOSE_GY:g} Gy (MAX_DOSE_GY; a dose in cGy?). "
                                                 f"Received: {prescription!r}")
            prescription = float(prescription)
        elif prescription is not None:
            fail(f"{field}.prescription_gy", f"organ at risk {sname!r} has a prescription; only targets do")
        names = _name_list(entry.get("dicom_names", [sname]), f"{field}.dicom_names", fail)
        required = entry.get("required", True)
        if not isinstance(required, bool):
            fail(f"{field}.required", f"expected true or false. Received: {required!r}")
        if kind == "oar" and "required" in entry:
            fail(f"{field}.required", f"organ at risk {sname!r}: only a target is required or optional (a missing "
                                      f"organ is an empty mask)")
        structures.append(Structure(sname, kind, prescription, names, required))
    if not any(s.kind == "target" for s in structures):
        fail("structures", "no target: a site needs at least one (kind 'target', with prescription_gy)")
    if not any(s.kind == "target" and s.required for s in structures):
        fail("structures", "every target is optional: at least one must be required (\"required\": true), or a "
                           "patient without any target would be imported")

    pairs = data.get("mirror_pairs", [])
    if not isinstance(pairs, list):
        fail("mirror_pairs", "expected a list of [right, left] pairs")
    mirror_pairs, paired = [], set()
    for k, pair in enumerate(pairs):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            fail(f"mirror_pairs[{k}]", f"expected [right, left] structure names. Received: {pair!r}")
        if pair[0] == pair[1]:
            fail(f"mirror_pairs[{k}]", f"a structure cannot mirror itself ({pair[0]!r})")
        for member in pair:
            if member not in seen:
                fail(f"mirror_pairs[{k}]", f"unknown structure {member!r}")
            if member in paired:
                fail(f"mirror_pairs[{k}]", f"{member!r} is in two pairs")
            paired.add(member)
        right, left = (next(s for s in structures if s.name == member) for member in pair)
        if not (right.kind == left.kind == "oar" or (right.kind == left.kind == "target"
                                                     and right.prescription_gy == left.prescription_gy)):
            fail(f"mirror_pairs[{k}]", f"{_described(right)} and {_described(left)}: a left-right flip swaps the "
                                       f"two, so a pair is two organs at risk or two targets of one prescription")
        mirror_pairs.append((pair[0], pair[1]))

    body = data.get("body", {"dicom_names": ["BODY", "External"]})
    if not isinstance(body, dict) or set(body) - {"dicom_names"}:
        fail("body", 'expected {"dicom_names": [...]}')
    body_names = _name_list(body.get("dicom_names", ["BODY"]), "body.dicom_names", fail)
    claimed = {}  # normalised DICOM name -> the structure (or body) it is matched to
    for owner, names in [*((s.name, s.dicom_names) for s in structures), ("body", body_names)]:
        for roi in names:
            other = claimed.setdefault(normalise_name(roi), owner)
            if other != owner:
                fail("dicom_names", f"{roi!r} matches both {other} and {owner}: an ROI would be both")

    metrics = data.get("metrics", {"oar": ["D_0.1_cc", "mean"], "target": ["D_99", "D_95", "D_1"]})
    if not isinstance(metrics, dict) or set(metrics) != set(KINDS):
        fail("metrics", f"expected an object with the keys {' and '.join(KINDS)}")
    for kind, listed in metrics.items():
        if not isinstance(listed, list) or not listed:
            fail(f"metrics.{kind}", "expected a non-empty list such as ['D_0.1_cc', 'mean']")
        for metric in listed:
            try:
                measure, amount = parse_metric(metric)
            except ValueError:
                fail(f"metrics.{kind}", f"unknown metric {metric!r}; expected mean, D_<percent of volume> (D_95) or "
                                        f"D_<cc>_cc (D_0.1_cc)")
            if measure == "percent" and not 0 <= amount <= 100:
                fail(f"metrics.{kind}", f"{metric!r}: a percentage of the volume is between 0 and 100")
            if measure == "cc" and amount > MAX_METRIC_CC:
                fail(f"metrics.{kind}", f"{metric!r}: {amount:g} cc is more than any structure holds (at most "
                                        f"{MAX_METRIC_CC:g} cc, MAX_METRIC_CC); a volume in mm³?")
    metrics = {kind: tuple(metrics[kind]) for kind in KINDS}

    grid = data.get("grid", {"shape": [128, 128, 128], "slices": "targets"})
    if not isinstance(grid, dict) or set(grid) - {"shape", "slices"}:
        fail("grid", 'expected {"shape": [128, 128, 128], "slices": "targets"}')
    shape = tuple(grid.get("shape", (128, 128, 128))) if isinstance(grid.get("shape", []), list) else None
    if shape not in GRID_SHAPES:
        fail("grid.shape", f"expected one of {', '.join(str(list(s)) for s in GRID_SHAPES)}. Received: {grid.get('shape')!r}")
    slices = grid.get("slices", "targets")
    if slices not in SLICE_PLACEMENTS:
        fail("grid.slices", f"expected one of {', '.join(SLICE_PLACEMENTS)}. Received: {slices!r}")

    ceiling = data.get("dose_ceiling_gy")
    if ceiling is not None:
        highest = max(s.prescription_gy for s in structures if s.kind == "target")
        if isinstance(ceiling, bool) or not isinstance(ceiling, (int, float)) or not math.isfinite(ceiling):
            fail("dose_ceiling_gy", f"expected a number of Gy. Received: {ceiling!r}")
        if not highest < ceiling <= MAX_DOSE_CEILING_GY:
            fail("dose_ceiling_gy", f"expected more than the highest prescription ({_plain(highest)} Gy) and at most "
                                    f"{MAX_DOSE_CEILING_GY:g} Gy (a dose in cGy?). Received: {ceiling!r}")
        ceiling = float(ceiling)

    return Site(name=name, description=description, structures=tuple(structures), mirror_pairs=tuple(mirror_pairs),
                body_names=body_names, metrics=metrics, grid={"shape": shape, "slices": slices},
                beams=beams_from_dict(data.get("beams", {"type": "none"}), source),
                goals=goals_from_list(data.get("goals", []), source, {s.name: s.kind for s in structures}, metrics),
                dose_ceiling=ceiling)


def goals_from_list(goals, source, kinds: dict[str, str], metrics: dict) -> tuple[Goal, ...]:
    """A site file's ``goals`` field: a list of ``{"structure", "metric", "max_gy"}`` or ``{...,
    "min_gy"}``; ``kinds``: each structure's kind, ``metrics``: the site's metrics per kind (a
    goal's metric is one of its structure's kind, or a clinical one)."""
    def fail(field, problem):
        raise SiteError(source, field, problem)

    if not isinstance(goals, list):
        fail("goals", 'expected a list of {"structure", "metric", "max_gy" or "min_gy"}')
    parsed = []
    for k, goal in enumerate(goals):
        field = f"goals[{k}]"
        if not isinstance(goal, dict):
            fail(field, f'expected {{"structure", "metric", "max_gy" or "min_gy"}}. Received: {goal!r}')
        for key in goal:
            if key not in ("structure", "metric", "max_gy", "min_gy"):
                fail(f"{field}.{key}", "unknown field; expected structure, metric, max_gy or min_gy")
        structure = goal.get("structure")
        if not isinstance(structure, str) or structure not in kinds:
            fail(f"{field}.structure", f"unknown structure {structure!r}; expected one of {', '.join(kinds)}")
        allowed = (*metrics[kinds[structure]], *CLINICAL_METRICS)
        if not isinstance(goal.get("metric"), str) or goal["metric"] not in allowed:
            fail(f"{field}.metric", f"unknown metric {goal.get('metric')!r} for {kinds[structure]} {structure}; "
                                    f"expected one of {', '.join(allowed)}")
        bounds = [key for key in ("max_gy", "min_gy") if key in goal]
        if len(bounds) != 1:
            fail(field, f"expected exactly one of max_gy (at most) and min_gy (at least). Received: "
                        f"{' and '.join(bounds) if bounds else 'neither'}")
        value = goal[bounds[0]]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            fail(f"{field}.{bounds[0]}", f"expected a finite number of Gy, 0 or more. Received: {value!r}")
        parsed.append(Goal(structure, goal["metric"], **{bounds[0]: float(value)}))
    return tuple(parsed)


def beams_from_dict(beams, source) -> Beams:
    """A site file's ``beams`` field: ``{"type": "static", "angles": [...]}``, ``{"type": "arcs",
    "arcs": [{"start", "stop", "direction"}]}`` or ``{"type": "none"}``."""
    def fail(field, problem):
        raise SiteError(source, field, problem)

    if not isinstance(beams, dict) or "type" not in beams:
        fail("beams", 'expected {"type": "static" | "arcs" | "none", ...}')
    kind = beams["type"]
    if kind == "none":
        if set(beams) != {"type"}:
            fail("beams", "type none takes no other field")
        return Beams("none")
    if kind == "static":
        if set(beams) != {"type", "angles"}:
            fail("beams", 'type static takes "angles" (gantry degrees)')
        angles = beams["angles"]
        if not isinstance(angles, list) or not angles or not all(_is_angle(a) for a in angles):
            fail("beams.angles", f"expected a non-empty list of gantry angles in degrees. Received: {angles!r}")
        outside = [a for a in angles if not is_gantry_angle(a)]
        if outside:
            fail("beams.angles", f"expected gantry angles in [0, 360) degrees. Received: {outside[0]!r}")
        if len({float(a) for a in angles}) != len(angles):
            fail("beams.angles", f"two beams at the same gantry angle: {angles!r}")
        return Beams("static", angles=tuple(float(a) for a in angles))
    if kind == "arcs":
        if set(beams) != {"type", "arcs"}:
            fail("beams", 'type arcs takes "arcs" (a list of {"start", "stop", "direction"})')
        arcs = beams["arcs"]
        if not isinstance(arcs, list) or not arcs:
            fail("beams.arcs", "expected a non-empty list of arcs")
        parsed = []
        for k, arc in enumerate(arcs):
            if not isinstance(arc, dict) or set(arc) != {"start", "stop", "direction"}:
                fail(f"beams.arcs[{k}]", 'expected {"start": degrees, "stop": degrees, "direction": "CW" | "CC"}')
            if not (_is_angle(arc["start"]) and _is_angle(arc["stop"])):
                fail(f"beams.arcs[{k}]", "start and stop must be gantry angles in degrees")
            for end in ("start", "stop"):
                if not is_gantry_angle(arc[end]):
                    fail(f"beams.arcs[{k}].{end}",
                         f"expected a gantry angle in [0, 360) degrees. Received: {arc[end]!r}")
            if arc["direction"] not in DIRECTIONS:
                fail(f"beams.arcs[{k}].direction", f"expected CW or CC. Received: {arc['direction']!r}")
            parsed.append(Arc(float(arc["start"]), float(arc["stop"]), arc["direction"]))
        return Beams("arcs", arcs=tuple(parsed))
    fail("beams.type", f"expected static, arcs or none. Received: {kind!r}")


def _described(structure: Structure) -> str:
    """``'PTV70' (a target of 70 Gy)``, ``'Parotid_R' (an organ at risk)``."""
    if structure.kind == "target":
        return f"{structure.name!r} (a target of {_plain(structure.prescription_gy)} Gy)"
    return f"{structure.name!r} (an organ at risk)"


def _is_angle(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _name_list(names, field, fail) -> tuple[str, ...]:
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and re.search(r"[0-9A-Za-z]", n)
                                                          for n in names):
        fail(field, "expected a non-empty list of ROI names")
    return tuple(names)
