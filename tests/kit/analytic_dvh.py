"""Structures of known volume in a dose of known gradient, written as DICOM (CT, RTSTRUCT), whose
DVH metrics are known in closed form: the oracle of the clinical DVH table (``scripts/dvh_analytic.py``
and ``tests/test_dvh_analytic.py``).

A structure is a sphere or a cylinder along the slice axis, drawn as a planning system draws it:
on every CT slice that cuts it, one closed polygon of the cut's circle (equal in area to the circle,
so that the polygons add no error of their own). A cylinder may skip slices (``skip``: contours
left out on those slices, as a planner who forgot one draws it). The dose is linear,
``D = gy_at_origin + gradient · (u · p)`` along a unit direction ``u``, or uniform. A structure's
DVH is then the distribution over its volume of ``s = u · (p - centre)``:

- a sphere of radius ``R`` (any ``u``): the volume above ``s`` is a spherical cap of height
  ``h = R - s``, a fraction ``h² (3R - h) / 4R³`` of the sphere;
- a cylinder of radius ``r`` and length ``L``: ``s = a t + b w`` with ``a = |u_xy|``, ``b = u_z``,
  ``t`` the in-plane offset along ``u``'s in-plane direction (density ``2√(r² - t²) / πr²``: above
  ``t`` lies a circular segment of height ``h = r - t``, ``(r² acos(1 - h/r) - (r - h)√(2rh - h²)) / πr²``)
  and ``w`` uniform over ``[-L/2, L/2]``: across the axis (``b = 0``) the segment, along it
  (``a = 0``) the uniform distribution, obliquely their convolution, one integral over ``t``
  (``t = r sin θ``, the midpoint rule on 20 000 points: 1e-8 of the volume).

``Dx`` (the dose ``x`` % of the volume receives at least) is where that fraction is ``x`` %
(inverted by bisection to 1e-9 mm); ``D1`` where it is 1 %, ``Dmax`` the highest value (on the
surface), ``Dmean`` the centre's (every distribution here is symmetric about the centre).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np

from tests.kit.synthetic import new_study, write_ct_series, write_structure_set

WATER_HU, AIR_HU = 0.0, -1000.0
METRICS = ("D99", "D95", "D50", "Dmean", "D1", "Dmax")
# The fraction of the volume (at least) that receives each Dx
PERCENT_METRICS = {"D99": 99.0, "D95": 95.0, "D50": 50.0, "D1": 1.0}
CONTOUR_POINT_MM = 0.5  # at most this far between a polygon's vertices (planning systems: about 1 mm or less)
_THETA = (np.arange(20000) + 0.5) / 20000 * np.pi - np.pi / 2  # the cylinder's integral's nodes


@dataclasses.dataclass(frozen=True)
class CTGrid:
    """A CT's grid: square pixels of ``pixel_mm`` (``size`` × ``size``), ``slices`` slices every
    ``slice_mm`` from ``top_z`` down; ``origin`` the centre of pixel (row 0, column 0)."""

    pixel_mm: float = 0.9765625  # 500 mm / 512, a clinic's head-and-neck CT (and exact in binary)
    size: int = 128
    slice_mm: float = 2.5
    slices: int = 32
    top_z: float = 40.0
    origin: tuple[float, float] = (-61.83, -62.21)

    @property
    def slice_z(self) -> np.ndarray:
        return self.top_z - np.arange(self.slices) * self.slice_mm

    @property
    def voxel_mm3(self) -> float:
        return self.pixel_mm ** 2 * self.slice_mm


@dataclasses.dataclass(frozen=True)
class Sphere:
    name: str
    centre: tuple[float, float, float]  # x, y, z mm
    radius: float

    @property
    def volume_mm3(self) -> float:
        return 4.0 / 3.0 * math.pi * self.radius ** 3

    @property
    def middle(self) -> np.ndarray:
        return np.asarray(self.centre, dtype=np.float64)

    def radius_at(self, z: float) -> float:
        """The radius of the cut at ``z`` (0 where the plane misses the sphere)."""
        return math.sqrt(max(self.radius ** 2 - (z - self.centre[2]) ** 2, 0.0))

    def reach(self, u: np.ndarray) -> float:
        """The largest ``s`` in the structure."""
        return self.radius

    def fraction_above(self, s: float, u: np.ndarray) -> float:
        """The fraction of the volume whose ``u · (p - centre)`` is at least ``s``."""
        h = min(max(self.radius - s, 0.0), 2 * self.radius)
        return h * h * (3 * self.radius - h) / (4 * self.radius ** 3)


@dataclasses.dataclass(frozen=True)
class Cylinder:
    """Axis along z, from ``z_low`` to ``z_high`` (mm); ``skip``: CT slices (z, mm) that cut it but
    are left without a contour."""

    name: str
    centre: tuple[float, float]  # x, y mm of its axis
    radius: float
    z_low: float
    z_high: float
    skip: tuple[float, ...] = ()

    @property
    def volume_mm3(self) -> float:
        return math.pi * self.radius ** 2 * (self.z_high - self.z_low)

    @property
    def middle(self) -> np.ndarray:
        return np.array([self.centre[0], self.centre[1], (self.z_low + self.z_high) / 2])

    def radius_at(self, z: float) -> float:
        return self.radius if self.z_low < z < self.z_high else 0.0

    def reach(self, u: np.ndarray) -> float:
        return math.hypot(u[0], u[1]) * self.radius + abs(u[2]) * (self.z_high - self.z_low) / 2

    def fraction_above(self, s: float, u: np.ndarray) -> float:
        a, b, r, half = math.hypot(u[0], u[1]), abs(float(u[2])), self.radius, (self.z_high - self.z_low) / 2
        if b < 1e-12:  # across the axis: a circular segment
            h = min(max(r - s / a, 0.0), 2 * r)
            return (r * r * math.acos(1 - h / r) - (r - h) * math.sqrt(max(2 * r * h - h * h, 0.0))) / (math.pi * r * r)
        if a < 1e-12:  # along the axis: uniform
            return min(max((half - s / b) / (2 * half), 0.0), 1.0)
        # t = r sin θ: the in-plane density 2√(r² - t²)/πr² dt is (2/π) cos²θ dθ; w above (s - a t) / b
        t = r * np.sin(_THETA)
        above = np.clip((half - (s - a * t) / b) / (2 * half), 0.0, 1.0)
        return float(np.sum(2 / np.pi * np.cos(_THETA) ** 2 * above) * (np.pi / _THETA.size))


@dataclasses.dataclass(frozen=True)
class Field:
    """A dose ``gy_at_origin + gradient · (u · p)`` along ``direction`` (normalised; ``None``:
    uniform), never below zero (far from the structures)."""

    name: str
    direction: tuple[float, float, float] | None
    gy_at_origin: float = 50.0
    gradient: float = 2.0  # Gy/mm (positive)

    @property
    def u(self) -> np.ndarray:
        u = np.asarray(self.direction, dtype=np.float64)
        return u / np.linalg.norm(u)

    def at(self, x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
        """The dose at the points (broadcast together)."""
        shape = np.broadcast(x, y, z).shape
        if self.direction is None:
            return np.full(shape, float(self.gy_at_origin))
        u = self.u
        return np.maximum(self.gy_at_origin + self.gradient * (u[0] * x + u[1] * y + u[2] * z), 0.0) * np.ones(shape)


def analytic_table(structure, field: Field) -> dict[str, float]:
    """The structure's D99, D95, D50, Dmean, D1, Dmax (Gy) in ``field``, and its volume (cm³)."""
    volume_cc = structure.volume_mm3 / 1000
    if field.direction is None:
        return {**{m: float(field.gy_at_origin) for m in METRICS}, "volume_cc": volume_cc}
    u = field.u
    reach = structure.reach(u)
    centre_gy = field.gy_at_origin + field.gradient * float(u @ structure.middle)

    def offset_with(fraction: float) -> float:  # the s with `fraction` of the volume above it
        low, high = -reach, reach
        while high - low > 1e-9:
            mid = (low + high) / 2
            if structure.fraction_above(mid, u) > fraction:
                low = mid
            else:
                high = mid
        return (low + high) / 2

    table = {m: centre_gy + field.gradient * offset_with(p / 100) for m, p in PERCENT_METRICS.items()}
    table["Dmean"] = centre_gy
    table["Dmax"] = centre_gy + abs(field.gradient) * reach
    return {m: float(table[m]) for m in METRICS} | {"volume_cc": volume_cc}


def circle(x: float, y: float, z: float, radius: float, phase: float = 0.1) -> np.ndarray:
    """A closed polygon ``(points, 3)`` of the same area as the circle (its vertices slightly outside)."""
    n = max(12, math.ceil(2 * math.pi * radius / CONTOUR_POINT_MM))
    scale = math.sqrt(2 * math.pi / (n * math.sin(2 * math.pi / n)))
    angle = phase + 2 * math.pi * np.arange(n) / n
    return np.stack([x + radius * scale * np.cos(angle), y + radius * scale * np.sin(angle), np.full(n, z)], axis=1)


def contours(structure, slice_z: np.ndarray) -> list[np.ndarray]:
    """The structure's polygons on the CT slices that cut it (none on a cylinder's skipped slices)."""
    polygons = []
    for z in slice_z.tolist():
        radius = structure.radius_at(z)
        if radius <= 0 or any(abs(z - skipped) < 1e-6 for skipped in getattr(structure, "skip", ())):
            continue
        polygons.append(circle(structure.centre[0], structure.centre[1], z, radius))
    return polygons


def default_structures(grid: CTGrid) -> list:
    """A target-sized sphere, a sphere of a few dozen voxels, one of a few voxels (drawn on one
    slice), a cord-sized cylinder and the same cylinder with its contour missing on one slice."""
    dz = grid.slice_mm
    z_low, z_high = -5.5 * dz, 5.5 * dz  # the cylinders' ends midway between slices: 11 slabs of slice_mm
    return [Sphere("Sphere", (-35.3, 0.21, 0.0), 15.0),
            Sphere("SmallSphere", (-8.13, 0.37, 0.0), 3.0),
            Sphere("TinySphere", (2.61, -0.29, 0.0), 1.5),
            Cylinder("Cylinder", (16.4, 0.13), 5.0, z_low, z_high),
            Cylinder("CylinderGap", (32.7, -0.41), 5.0, z_low, z_high, skip=(-3 * dz,))]


# A uniform dose; a gradient across the slices' rows (in-plane), one along the slice axis, and one oblique
DEFAULT_FIELDS = (Field("uniform", None), Field("gradient_y", (0.0, 1.0, 0.0)), Field("gradient_z", (0.0, 0.0, 1.0)),
                  Field("gradient_oblique", (0.36, 0.48, 0.8), gy_at_origin=70.0))


def site_dict(structures: list) -> dict:
    """A site (``provided_code.sites``) whose structures are these: the first a target, the rest organs."""
    return {"name": "analytic", "beams": {"type": "none"},
            "structures": [{"name": s.name, "kind": "target", "prescription_gy": 50} if k == 0 else
                           {"name": s.name, "kind": "oar"} for k, s in enumerate(structures)]}


def write_phantom(folder: Path, grid: CTGrid, structures: list, body_radius: float = 58.0,
                  seed: int = 0) -> tuple[Path, Path]:
    """A CT (water inside a cylinder of ``body_radius`` about the z axis, air outside) and an
    RTSTRUCT holding ``structures`` and a BODY; returns (the CT folder, the RTSTRUCT)."""
    folder = Path(folder)
    study = new_study("ANALYTIC", "Analytic^Phantom")
    from pydicom.uid import generate_uid

    frame_uid, series = generate_uid(), generate_uid()
    y = grid.origin[1] + np.arange(grid.size)[:, None] * grid.pixel_mm
    x = grid.origin[0] + np.arange(grid.size)[None, :] * grid.pixel_mm
    plane = np.where(x ** 2 + y ** 2 <= body_radius ** 2, WATER_HU, AIR_HU).astype(np.float32)
    write_ct_series(folder / "ct", lambda k: plane, study, frame_uid, series, grid.origin,
                    (grid.pixel_mm, grid.pixel_mm), grid.slice_z, grid.slice_mm, np.random.default_rng(seed))
    rois = {s.name: contours(s, grid.slice_z) for s in structures}
    rois["BODY"] = [circle(0.0, 0.0, z, body_radius) for z in grid.slice_z.tolist()]
    rtstruct = folder / "RS.dcm"
    write_structure_set(rtstruct, study, frame_uid, series, rois)
    return folder / "ct", rtstruct


def dicompyler_table(dvhcalc, rtstruct: Path, rtdose: Path, roi_number: int, **options) -> dict[str, float] | None:
    """dicompyler-core's figures for one ROI (``dvhcalc``: its module, ``options``: ``get_dvh``'s),
    read as it reads them (its ``statistic``, ``mean``, ``max``, ``volume``); None for an empty DVH."""
    dvh = dvhcalc.get_dvh(str(rtstruct), str(rtdose), roi_number, **options)
    if dvh.volume == 0:
        return None
    return {"D99": float(dvh.statistic("D99").value), "D95": float(dvh.statistic("D95").value),
            "D50": float(dvh.statistic("D50").value), "Dmean": float(dvh.mean),
            "D1": float(dvh.statistic("D1").value), "Dmax": float(dvh.max), "volume_cc": float(dvh.volume)}


def compare(folder: Path, grid: CTGrid, structures: list, fields=DEFAULT_FIELDS, supersample=(4,),
            dicompyler=None, dicompyler_options: dict | None = None) -> dict:
    """The analytic check: the phantom written as DICOM and imported as ``openkbp-dicom predict``
    imports it; for each field its dose at the CT's voxel centres written as ``RD.dcm`` (as predict
    exports a prediction) and tabulated by the package's table (:func:`provided_code.dicom.dvh.dvh_report`
    on the import's voxels and contours: ``ours``, and supersampled: ``ours_supersampled_<N>``; every
    structure at its voxel centres, the small ones too: ``ours_voxel_centres``), and,
    given its ``dvhcalc`` module, by dicompyler-core from ``RD.dcm`` and the RTSTRUCT (``dicompyler``,
    and with ``dicompyler_options``: ``dicompyler_interpolated``); each beside the closed form
    (``analytic``), with the differences (method - analytic, Gy; cm³ for the volume) and, per
    method, their mean and largest size over structures and metrics (the uniform dose left out)."""
    from pydicom import dcmread

    from provided_code.dicom.dvh import dvh_report
    from provided_code.dicom.importer import import_patient
    from provided_code.dicom.rtdose import write_rtdose
    from provided_code.metrics.dvh_table import clinical_dvh_of_values
    from provided_code.sites import load_site

    folder = Path(folder)
    ct_dir, rtstruct = write_phantom(folder, grid, structures)
    imported = import_patient(ct_dir, rtstruct, folder / "patient", site=load_site(site_dict(structures)))
    geometry = imported.geometry
    numbers = {str(roi.ROIName): int(roi.ROINumber) for roi in dcmread(rtstruct).StructureSetROISequence}
    z, y, x = np.asarray(geometry.slice_z)[:, None, None], geometry.ct_y()[None, :, None], geometry.ct_x()[None, None, :]
    result = {"grid": dataclasses.asdict(grid),
              "structures": {s.name: {**{k: v for k, v in dataclasses.asdict(s).items() if k != "name"},
                                      "kind": type(s).__name__.lower(), "volume_cc": s.volume_mm3 / 1000,
                                      "ct_voxels": int(imported.ct_voxels[s.name].size)} for s in structures},
              "import": imported.lines, "fields": {}}
    errors: dict[str, list[float]] = {}
    for field in fields:
        dose_ct = field.at(x, y, z).astype(np.float32)
        rtdose = write_rtdose(folder / f"RD-{field.name}.dcm", dose_ct, geometry)
        tables = {"ours": dvh_report(geometry, imported.ct_voxels, imported.contours, {"predicted": dose_ct}, 1)}
        flat = dose_ct.reshape(-1)  # every structure at its voxel centres, the small ones too
        voxel_cc = grid.voxel_mm3 / 1000
        tables["ours_voxel_centres"] = {
            "predicted": clinical_dvh_of_values({key: flat[v] for key, v in imported.ct_voxels.items()}),
            "volume_cc": {key: v.size * voxel_cc for key, v in imported.ct_voxels.items()}}
        for n in supersample:
            tables[f"ours_supersampled_{n}"] = dvh_report(geometry, imported.ct_voxels, imported.contours,
                                                          {"predicted": dose_ct}, n)
        rows = {}
        for s in structures:
            row = {"analytic": analytic_table(s, field)}
            if field.direction is not None and row["analytic"]["Dmax"] - 2 * abs(field.gradient) * s.reach(field.u) <= 0:
                raise ValueError(f"Invalid `field` {field.name}: below zero Gy in {s.name}, where its closed form does "
                                 f"not hold; raise gy_at_origin")
            for method, table in tables.items():
                if s.name in table["predicted"]:
                    row[method] = {**table["predicted"][s.name], "volume_cc": table["volume_cc"][s.name]}
            if dicompyler is not None:
                methods = {"dicompyler": {}, **({"dicompyler_interpolated": dicompyler_options}
                                               if dicompyler_options else {})}
                for method, options in methods.items():
                    figures = dicompyler_table(dicompyler, rtstruct, rtdose, numbers[s.name], **options)
                    if figures is not None:
                        row[method] = figures
            row["difference"] = {method: {m: values[m] - row["analytic"][m] for m in (*METRICS, "volume_cc")}
                                 for method, values in row.items() if method != "analytic"}
            absent = [method for method in (*tables,
                                            *(["dicompyler"] if dicompyler is not None else []),
                                            *(["dicompyler_interpolated"] if dicompyler is not None and dicompyler_options
                                              else [])) if method not in row]
            if absent:
                row["absent"] = absent  # no figures: the structure holds no sample (dicompyler-core: one plane)
            if field.direction is not None:
                for method, differences in row["difference"].items():
                    errors.setdefault(method, []).extend(abs(differences[m]) for m in METRICS)
            rows[s.name] = row
        result["fields"][field.name] = {"direction": field.direction, "gy_at_origin": field.gy_at_origin,
                                        "gradient_gy_per_mm": field.gradient, "structures": rows}
    result["summary"] = {method: {"mean_abs_gy": float(np.mean(values)), "max_abs_gy": float(np.max(values)),
                                  "figures": len(values)} for method, values in errors.items()}
    return result
