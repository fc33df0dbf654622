"""Synthetic head-and-neck patients in the exact OpenKBP layout, deterministic by seed.

Each phantom has a head-like CT (air outside an ellipsoidal body, soft tissue, a skull shell and a
mandible of bone), all 10 structures in anatomically plausible places (axis 0 anterior→posterior,
axis 1 patient right→left, axis 2 superior→inferior), a possible-dose mask (the body) and a
plausible dose: each target at its prescription, falling off with distance outside, lower inside
organs at risk, zero outside the possible-dose mask. Non-overlapping targets, as in OpenKBP.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from provided_code.constants import (
    CT_FILE,
    CT_MAX,
    DOSE_FILE,
    POSSIBLE_DOSE_MASK_FILE,
    VOLUME_SHAPE,
    VOXEL_DIMENSIONS_FILE,
)
from provided_code.data.csv_io import write_sparse_csv
from provided_code.data_folder import split_dir as split_dir_of  # (a parameter below is named split_dir)
from provided_code.data.patient_plan import read_beams, read_prescriptions, write_beams, write_prescriptions
from provided_code.errors import UserError
from provided_code.infra.atomic import write_text_atomic
from provided_code.beams import ray_bins, ray_count
from provided_code.sites import Site, openkbp


def _ellipsoid(grid, centre, radii) -> np.ndarray:
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grid, centre, radii)) <= 1.0


def make_phantom(seed: int) -> dict[str, np.ndarray]:
    """The volumes of one phantom: ``ct`` (uint16), ``dose`` (float32 Gy), ``possible_dose_mask``,
    ``voxel_dimensions`` (mm) and one bool mask per structure name."""
    rng = np.random.default_rng(seed)
    grid = np.ogrid[0:VOLUME_SHAPE[0], 0:VOLUME_SHAPE[1], 0:VOLUME_SHAPE[2]]
    grid = [g.astype(np.float32) for g in grid]
    c0, c1, c2 = 64 + rng.uniform(-4, 4, 3)
    voxel_dimensions = np.array([rng.choice([3.5, 3.6, 3.9])] * 2 + [rng.choice([2.0, 2.5])])

    body = _ellipsoid(grid, (c0, c1, c2), (34 + rng.uniform(-2, 2), 40 + rng.uniform(-2, 2), 52))
    skull_outer = _ellipsoid(grid, (c0, c1, c2 - 22), (32, 38, 30))
    skull = skull_outer & ~_ellipsoid(grid, (c0, c1, c2 - 22), (29, 35, 27)) & body

    jaw = (_ellipsoid(grid, (c0 - 4, c1, c2 + 6), (26, 30, 6))
           & ~_ellipsoid(grid, (c0 - 4, c1, c2 + 6), (23, 27, 7)) & (grid[0] < c0 - 8))
    cord = ((grid[0] - (c0 + 18)) ** 2 + (grid[1] - c1) ** 2 <= 16) & (grid[2] > c2 - 10) & body
    esophagus = ((grid[0] - (c0 + 11)) ** 2 + (grid[1] - c1) ** 2 <= 16) & (grid[2] > c2 + 24) & body
    side = rng.choice([-1.0, 1.0])  # the primary tumour's side
    ptv70 = _ellipsoid(grid, (c0 - 2, c1 + side * rng.uniform(6, 12), c2 + 6), (9, 9, 11)) & body
    ptv63 = _ellipsoid(grid, (c0 + 2, c1 + side * 16, c2 + 10), (12, 12, 15)) & body & ~ptv70
    ptv56 = _ellipsoid(grid, (c0 + 4, c1 - side * 18, c2 + 14), (10, 10, 16)) & body & ~ptv70 & ~ptv63
    targets = ptv70 | ptv63 | ptv56
    structures = {
        "Brainstem": _ellipsoid(grid, (c0 + 8, c1, c2 - 24), (6, 6, 12)),
        "SpinalCord": cord,
        "RightParotid": _ellipsoid(grid, (c0 + 2, c1 - 24, c2 - 6), (9, 6, 10)) & body,
        "LeftParotid": _ellipsoid(grid, (c0 + 2, c1 + 24, c2 - 6), (9, 6, 10)) & body,
        "Esophagus": esophagus,
        "Larynx": _ellipsoid(grid, (c0 - 16, c1, c2 + 26), (6, 7, 9)) & body,
        "Mandible": jaw & body,
        "PTV56": ptv56,
        "PTV63": ptv63,
        "PTV70": ptv70,
    }

    ct = np.where(body, 1000 + rng.normal(0, 15, VOLUME_SHAPE), 0)
    ct = np.where(skull | structures["Mandible"], 1800 + rng.normal(0, 60, VOLUME_SHAPE), ct)
    ct = np.clip(np.rint(ct), 0, CT_MAX).astype(np.uint16)
    ct[body & (ct == 0)] = 1  # CT is non-zero inside the body

    # Dose: prescription inside each target, exponential fall-off (mm) outside, spared OARs.
    mm = [g * s for g, s in zip(grid, voxel_dimensions)]
    dose = np.zeros(VOLUME_SHAPE, np.float32)
    for name, prescription in openkbp().prescriptions_gy.items():  # PTV56, PTV63, PTV70
        target = structures[name]
        if not target.any():
            continue
        points = np.nonzero(target)
        centre = [float(np.mean(p)) * s for p, s in zip(points, voxel_dimensions)]
        radius = (target.sum() * np.prod(voxel_dimensions) * 3 / (4 * np.pi)) ** (1 / 3)
        distance = np.sqrt(sum((m - c) ** 2 for m, c in zip(mm, centre))) - radius
        falloff = prescription * np.exp(-np.maximum(distance, 0) / 12.0)
        dose = np.maximum(dose, falloff.astype(np.float32))
        dose[target] = prescription * (1.0 + rng.normal(0, 0.01, int(target.sum())))
    for name, sparing in (("Brainstem", 0.5), ("SpinalCord", 0.5), ("RightParotid", 0.7),
                          ("LeftParotid", 0.7), ("Larynx", 0.8), ("Esophagus", 0.8)):
        organ = structures[name] & ~targets
        dose[organ] *= sparing
    dose = np.where(body, np.round(dose, 3), 0).astype(np.float32)
    return {"ct": ct, "dose": dose, "possible_dose_mask": body, "voxel_dimensions": voxel_dimensions,
            **structures}


def write_phantom_patient(folder: os.PathLike | str, seed: int, with_dose: bool = True) -> Path:
    """Write one phantom as an OpenKBP patient folder (``.../pt_<N>``) and return the folder."""
    return _write_volumes(Path(folder), make_phantom(seed), with_dose)


def _write_volumes(folder: Path, volumes: dict[str, np.ndarray], with_dose: bool) -> Path:
    """A phantom's volumes (as :func:`make_phantom` returns them) as a patient folder: ct.csv,
    dose.csv, possible_dose_mask.csv, voxel_dimensions.csv and a CSV per non-empty structure."""
    volumes = dict(volumes)
    folder.mkdir(parents=True, exist_ok=True)
    ct = volumes.pop("ct").reshape(-1)
    write_sparse_csv(folder / CT_FILE, np.flatnonzero(ct), ct[ct != 0])
    body = volumes.pop("possible_dose_mask").reshape(-1)
    dose = volumes.pop("dose").reshape(-1)
    body_indices = np.flatnonzero(body)
    if with_dose:
        write_sparse_csv(folder / DOSE_FILE, body_indices, dose[body_indices])
    write_sparse_csv(folder / POSSIBLE_DOSE_MASK_FILE, body_indices, None)
    voxel_dimensions = volumes.pop("voxel_dimensions")
    write_text_atomic(folder / VOXEL_DIMENSIONS_FILE, "".join(f"{v!r}\n" for v in voxel_dimensions.tolist()))
    for name, mask in volumes.items():
        indices = np.flatnonzero(mask.reshape(-1))
        if indices.size:
            write_sparse_csv(folder / f"{name}.csv", indices, None)
    return folder


def write_phantom_split(split_dir: os.PathLike | str, count: int, first_number: int = 1, seed: int = 0,
                        with_dose: bool = True) -> list[Path]:
    """Write ``count`` phantoms ``pt_<first_number>``, ... into ``split_dir``."""
    return [write_phantom_patient(Path(split_dir) / f"pt_{first_number + i}", seed=seed * 100003 + first_number + i,
                                  with_dose=with_dose)
            for i in range(count)]


# -- prostate -------------------------------------------------------------------------------------
# Synthetic prostate patients of the ``prostate`` site (provided_code/sites/prostate.json): a
# pelvis-like body, the prostate's PTV78 inside the PTV60 that also covers the seminal vesicles
# (stored disjoint, as OpenKBP's targets and the DICOM import make them: a voxel of both is PTV78's),
# the rectum behind, the bladder in front and above, the two femoral heads to the sides, each
# varying per patient. The dose is made from the beams: along each beam's rays through the targets
# (parallel rays, :func:`provided_code.beams.ray_bins`'s geometry, as the beam channels
# see them), attenuated with depth, with a lateral penumbra and a scatter tail, the rays through
# the organs at risk weighted down (as an optimiser spares them), summed over the plan's gantry
# angles and scaled per dose level so that each target's mean is its prescription.

PROSTATE_STRUCTURES = ("Rectum", "Bladder", "FemoralHead_R", "FemoralHead_L", "PTV60", "PTV78")
# The beams and prescriptions of a phantom with a plan of its own (``beams.csv``, ``prescriptions.csv``):
# a common seven-field coplanar IMRT arrangement, at the CHHiP conventional arm's 74 and 59.2 Gy.
SEVEN_FIELDS = (0.0, 50.0, 100.0, 155.0, 205.0, 260.0, 310.0)
OWN_PRESCRIPTIONS_GY = {"PTV78": 74.0, "PTV60": 59.2}
ATTENUATION_PER_MM = 0.0045  # about a 6 MV beam's in water beyond the build-up
BUILD_UP_MM = 5.0  # the skin dose is 30 % of the dose just below, rising over about this depth
PENUMBRA_MM = 3.5  # standard deviation of the lateral fall-off at a field edge (80-20 % over about 6 mm)
SCATTER_MM, SCATTER_FRACTION = 20.0, 0.1  # the broad part of the lateral kernel: the low-dose bath around the beams
SPARING_MM = 40.0
OPTIMISER_STEPS = 8
LOWER_TARGET_HOT = 1.1  # a ray through this much of an organ at risk (outside the targets) gets half the weight


class PhantomSiteError(UserError, ValueError):
    """No phantoms for a site: the synthetic patients exist for OpenKBP's and the prostate's structures."""


def _ellipsoid_mm(grid_mm, centre, radii) -> np.ndarray:
    return sum(((g - c) / r) ** 2 for g, c, r in zip(grid_mm, centre, radii)) <= 1.0


def _gaussian(size: int, sigma: float) -> np.ndarray:
    """``(size, size)``: a Gaussian of standard deviation ``sigma`` (in cells) between cells, each
    column summing to 1 far from the edges (a blur that keeps a broad field's level)."""
    offsets = np.arange(size)[:, None] - np.arange(size)[None, :]
    return np.exp(-0.5 * (offsets / sigma) ** 2) / (np.sqrt(2 * np.pi) * sigma)


def make_prostate_phantom(seed: int, gantry_angles=None, prescriptions: dict[str, float] | None = None, *,
                          site: Site) -> dict[str, np.ndarray]:
    """The volumes of one prostate phantom, as :func:`make_phantom` returns them, for ``site``'s
    structures (``load_site("prostate")``, or a site file with the same structure names).

    ``gantry_angles``: the beams the dose is delivered from (degrees; default the site's, its two
    arcs sampled every 10°); ``prescriptions``: target → Gy (default the site's). The anatomy
    depends on ``seed`` only, so one seed with two plans gives one patient with two doses.
    """
    if set(site.names) != set(PROSTATE_STRUCTURES):
        raise PhantomSiteError(f"No prostate phantoms for site {site.name}: its structures are "
                               f"{', '.join(site.names)}; the phantoms have {', '.join(PROSTATE_STRUCTURES)}")
    gantry_angles = site.beams.gantry_angles() if gantry_angles is None else tuple(gantry_angles)
    if not gantry_angles:
        raise PhantomSiteError(f"No beams for the prostate phantoms of site {site.name}: its `beams` are of type none "
                               f"and no gantry angles were given")
    prescriptions = {**site.prescriptions_gy, **(prescriptions or {})}

    rng = np.random.default_rng(seed)
    in_plane, slice_mm = rng.choice([3.7, 3.9, 4.1]), rng.choice([2.5, 3.0])
    voxel_dimensions = np.array([in_plane, in_plane, slice_mm])
    grid = np.ogrid[0:VOLUME_SHAPE[0], 0:VOLUME_SHAPE[1], 0:VOLUME_SHAPE[2]]
    mm = [g.astype(np.float32) * d for g, d in zip(grid, voxel_dimensions)]
    centre = (64 + rng.uniform(-3, 3, 3)) * voxel_dimensions  # the body's centre, mm
    body = _ellipsoid_mm(mm, centre, (120 + rng.uniform(-10, 10), 175 + rng.uniform(-12, 12), 300))
    fat = body & ~_ellipsoid_mm(mm, centre, (100, 150, 300))

    # The prostate (axis 0 anterior → posterior, axis 1 patient right → left, axis 2 superior → inferior)
    p0, p1, p2 = centre + (10 + rng.uniform(-5, 5), rng.uniform(-4, 4), rng.uniform(-6, 6))
    scale = rng.uniform(0.85, 1.2)
    prostate_radii = np.array([17.0, 22.0, 20.0]) * scale
    ptv78 = _ellipsoid_mm(mm, (p0, p1, p2), prostate_radii + 7) & body
    vesicles = np.zeros(VOLUME_SHAPE, bool)
    for side in (-1, 1):
        vesicles |= _ellipsoid_mm(mm, (p0 + 18, p1 + side * 14, p2 - 22 * scale), (7 + 8, 13 + 8, 11 + 8))
    ptv60 = (_ellipsoid_mm(mm, (p0, p1, p2), prostate_radii + 10) | vesicles) & body & ~ptv78

    rectum_radius = 14 + rng.uniform(-2, 2)
    rectum_ap = p0 + prostate_radii[0] + 5 + rectum_radius + 0.25 * np.maximum(p2 - mm[2], 0)  # curving back above
    rectum = (((mm[0] - rectum_ap) ** 2 + (mm[1] - p1) ** 2 <= rectum_radius ** 2)
              & (mm[2] > p2 - 50) & (mm[2] < p2 + 55) & body)
    gas = rectum & ((mm[0] - rectum_ap) ** 2 + (mm[1] - p1) ** 2 <= (0.4 * rectum_radius) ** 2) \
        & (rng.uniform() < 0.5) & (mm[2] < p2)
    fill = rng.uniform(0.75, 1.25)
    bladder = _ellipsoid_mm(mm, (p0 - 22 - 6 * fill, p1, p2 - 40 - 8 * fill), (28 * fill, 38 * fill, 30 * fill)) & body
    heads, shafts = {}, np.zeros(VOLUME_SHAPE, bool)
    spread = 88 + rng.uniform(-4, 4)
    for name, side in (("FemoralHead_R", -1), ("FemoralHead_L", 1)):
        heads[name] = _ellipsoid_mm(mm, (p0 - 5, p1 + side * spread, p2 - 8), (24, 24, 24)) & body
        shafts |= ((mm[0] - (p0 - 5)) ** 2 + (mm[1] - (p1 + side * (spread + 18))) ** 2 <= 13 ** 2) & (mm[2] > p2 + 20)
    pubis = _ellipsoid_mm(mm, (p0 - 42, p1, p2 - 12), (9, 24, 18))
    sacrum = _ellipsoid_mm(mm, (p0 + 75, p1, p2 - 70), (12, 40, 50))
    bone = (heads["FemoralHead_R"] | heads["FemoralHead_L"] | shafts | pubis | sacrum) & body

    noise = rng.normal(0, 1, VOLUME_SHAPE).astype(np.float32)
    ct = np.select([gas, bone, bladder, fat, body], [50 + 20 * noise, 1600 + 60 * noise, 1010 + 10 * noise,
                                                      910 + 15 * noise, 1040 + 15 * noise], 0)
    ct = np.clip(np.rint(ct), 0, CT_MAX).astype(np.uint16)
    ct[body & (ct == 0)] = 1  # CT is non-zero inside the body

    structures = {"Rectum": rectum, "Bladder": bladder, **heads, "PTV60": ptv60, "PTV78": ptv78}
    structures = {name: structures[name] for name in site.names}  # the site's channel order
    targets = {name: structures[name] for name in site.targets}
    organs = np.zeros(VOLUME_SHAPE, bool)
    for name in site.oars:
        organs |= structures[name]
    dose = beam_dose(body, targets, prescriptions, organs, gantry_angles, voxel_dimensions)
    dose = np.where(body, np.round(dose, 3), 0).astype(np.float32)
    return {"ct": ct, "dose": dose, "possible_dose_mask": body, "voxel_dimensions": voxel_dimensions, **structures}


def beam_dose(body: np.ndarray, targets: dict[str, np.ndarray], prescriptions: dict[str, float],
              organs: np.ndarray, gantry_angles, voxel_dimensions) -> np.ndarray:
    """A dose (Gy, float32) delivered from ``gantry_angles`` to ``targets`` (name → disjoint mask,
    each at ``prescriptions[name]``) inside ``body``, sparing ``organs``; square in-plane voxels.

    Each beam has a fluence per ray and slice (the rays of
    :func:`~provided_code.beams.ray_bins`): zero outside its aperture (the rays that cross
    a target in the same slice, and one more ray and slice on every side); inside, it starts at
    ``1 / (1 + L / SPARING_MM)`` for the ``L`` mm of organs outside the targets the ray crosses,
    and a few multiplicative updates (a plain fluence optimisation) then bring each target voxel
    towards its prescription. The dose of a beam at depth ``d`` below the body's surface along it
    is its fluence, blurred across the rays and the slices by a narrow (penumbra) and a broad
    (scatter) Gaussian, times ``exp(-ATTENUATION_PER_MM d)`` and a build-up. The sum over the
    beams is scaled so that the targets' voxels get their prescriptions on average.
    """
    size, _, slices = body.shape
    pitch, slice_mm = float(voxel_dimensions[0]), float(voxel_dimensions[2])
    plane, z = np.nonzero(body.reshape(size * size, slices))  # the body's voxels, as (in-plane index, slice)
    a = (plane // size - size / 2).astype(np.float32)
    b = (plane % size - size / 2).astype(np.float32)
    wanted = np.zeros(plane.size, np.float32)  # each target voxel's prescription; 0 outside the targets
    for name, mask in targets.items():
        wanted[mask.reshape(size * size, slices)[plane, z]] = prescriptions[name]
    target = np.flatnonzero(wanted > 0)
    # the most a target voxel may get: the highest level its prescription; the lower ones LOWER_TARGET_HOT × theirs
    most = np.where(wanted == wanted.max(), wanted, LOWER_TARGET_HOT * wanted)
    spared = organs.reshape(size * size, slices)[plane, z] & (wanted == 0)
    rays = ray_count(size)
    blurs = [((1 - SCATTER_FRACTION) * _gaussian(rays, PENUMBRA_MM / pitch), _gaussian(slices, PENUMBRA_MM / slice_mm)),
             (SCATTER_FRACTION * _gaussian(rays, SCATTER_MM / pitch), _gaussian(slices, SCATTER_MM / slice_mm))]

    def geometry(angle):
        """Each body voxel's (ray, slice) cell and its depth dose, for the beam at ``angle``."""
        g = np.deg2rad(angle)
        key = ray_bins(size, angle)[plane].astype(np.int64) * slices + z
        towards_source = -a * np.float32(np.cos(g)) + b * np.float32(np.sin(g))  # the source is at (-cos g, sin g)
        entry = np.full(rays * slices, -np.inf, np.float32)
        np.maximum.at(entry, key, towards_source)
        depth = (entry[key] - towards_source) * np.float32(pitch)
        return key, np.exp(-ATTENUATION_PER_MM * depth) * (1 - 0.7 * np.exp(-depth / BUILD_UP_MM))

    def blurred(fluence):
        used_rays, used_slices = np.flatnonzero(fluence.any(axis=1)), np.flatnonzero(fluence.any(axis=0))
        inner = fluence[np.ix_(used_rays, used_slices)]  # the blur of the rest is zero
        return sum(r[:, used_rays] @ inner @ s[used_slices] for r, s in blurs).reshape(-1).astype(np.float32)

    fluences, on_target = [], []  # per beam: its fluence (rays, slices); its cells and depth doses at the targets
    for angle in gantry_angles:
        key, depth_dose = geometry(angle)
        aperture = (np.bincount(key[target], minlength=rays * slices) > 0).reshape(rays, slices)
        for axis in (0, 1):  # one more ray and slice on every side: the penumbra falls outside the targets
            aperture = aperture | np.roll(aperture, 1, axis) | np.roll(aperture, -1, axis)
        crossed_organs = np.bincount(key[spared], minlength=rays * slices).reshape(rays, slices) * pitch
        fluences.append(aperture / (1 + crossed_organs / SPARING_MM))
        on_target.append((key[target], depth_dose[target]))
    for _ in range(OPTIMISER_STEPS):
        dose = sum(blurred(f)[k] * d for f, (k, d) in zip(fluences, on_target))
        dose = np.maximum(dose, 1e-6)
        ratio = np.clip(np.where(dose < wanted[target], wanted[target] / dose,  # below: up to the prescription
                                 np.minimum(most[target] / dose, 1.0)), 0.5, 2.0)  # above: down to the most allowed
        for fluence, (key, depth_dose) in zip(fluences, on_target):
            # each cell: the ratio its target voxels want, weighted by how much the beam gives them
            weight = np.bincount(key, depth_dose, minlength=fluence.size)
            change = np.bincount(key, depth_dose * ratio, minlength=fluence.size) / np.maximum(weight, 1e-12)
            fluence *= np.where(weight > 0, change, 1.0).reshape(fluence.shape) ** 0.8

    dose = np.zeros(plane.size, np.float32)
    for angle, fluence in zip(gantry_angles, fluences):
        key, depth_dose = geometry(angle)
        dose += blurred(fluence)[key] * depth_dose
    top = target[wanted[target] == wanted.max()]
    dose *= wanted.max() / dose[top].mean()  # the highest target's mean at its prescription
    volume = np.zeros(size * size * slices, np.float32)
    volume[plane * slices + z] = dose
    return volume.reshape(body.shape)


def write_prostate_phantom(folder: os.PathLike | str, seed: int, with_dose: bool = True, own_plan: bool = False, *,
                           site: Site) -> Path:
    """Write one prostate phantom as a patient folder and return it. ``own_plan``: the patient has
    a plan of its own, ``beams.csv`` (the seven ``SEVEN_FIELDS``) and ``prescriptions.csv``
    (``OWN_PRESCRIPTIONS_GY``), and its dose follows them; else the site's arcs and prescriptions."""
    folder = Path(folder)
    gantry_angles = prescriptions = None
    if own_plan:
        folder.mkdir(parents=True, exist_ok=True)
        write_beams(folder, [{"type": "static", "gantry_start": angle} for angle in SEVEN_FIELDS])
        write_prescriptions(folder, {name: OWN_PRESCRIPTIONS_GY[name] for name in site.targets})
        gantry_angles = read_beams(folder)[0].gantry_angles()  # the dose follows the files as they read
        prescriptions = read_prescriptions(folder, site)
    return _write_volumes(folder, make_prostate_phantom(seed, gantry_angles, prescriptions, site=site), with_dose)


def write_prostate_phantom_split(split_dir: os.PathLike | str, count: int, first_number: int = 1, seed: int = 0,
                                 with_dose: bool = True, own_plan_every: int = 0, *, site: Site) -> list[Path]:
    """Write ``count`` prostate phantoms ``pt_<first_number>``, ... into ``split_dir``; with
    ``own_plan_every`` n > 0, the patients whose number is a multiple of n have a plan of their own
    (:func:`write_prostate_phantom`)."""
    folders = []
    for i in range(count):
        number = first_number + i
        folders.append(write_prostate_phantom(Path(split_dir) / f"pt_{number}", seed=seed * 100003 + number,
                                              with_dose=with_dose, site=site,
                                              own_plan=own_plan_every > 0 and number % own_plan_every == 0))
    return folders


def write_site_phantom(folder: os.PathLike | str, seed: int, site: Site, with_dose: bool = True,
                       own_plan: bool = False) -> Path:
    """A phantom of ``site``'s structures: OpenKBP's head and neck, or a prostate
    (:func:`write_prostate_phantom`); any other site is refused in one line. ``own_plan`` only for
    a prostate."""
    if set(site.names) == set(PROSTATE_STRUCTURES):
        return write_prostate_phantom(folder, seed, with_dose=with_dose, own_plan=own_plan, site=site)
    if site.same_as(openkbp()):
        return write_phantom_patient(folder, seed, with_dose=with_dose)
    raise PhantomSiteError(f"No phantoms for site {site.name}: synthetic patients exist for the openkbp site and for "
                           f"sites with the prostate's structures ({', '.join(PROSTATE_STRUCTURES)})")


# The numbered phantoms of a data folder (the demo's, ablation.py's --phantoms): training patients pt_1, pt_2 …,
# validation patients from pt_201, each patient's number its seed; a prostate phantom whose number is a
# multiple of OWN_PLAN_EVERY has a plan of its own
FIRST_VALIDATION_NUMBER = 201
OWN_PLAN_EVERY = 4


def missing_numbered_phantoms(data_dir: os.PathLike | str, train: int, validation: int) -> dict[str, list[Path]]:
    """The folders of ``train`` training and ``validation`` validation numbered phantoms not yet
    written under ``data_dir`` (no ``voxel_dimensions.csv``), by split (``"train"``, ``"validation"``)."""
    missing = {}
    for split, count, first in (("train", train, 1), ("validation", validation, FIRST_VALIDATION_NUMBER)):
        folders = [split_dir_of(Path(data_dir), split) / f"pt_{first + i}" for i in range(count)]
        missing[split] = [folder for folder in folders if not (folder / VOXEL_DIMENSIONS_FILE).exists()]
    return missing


def write_numbered_phantom(folder: os.PathLike | str, site: Site) -> Path:
    """The phantom of ``site`` whose number (``.../pt_<N>``) is its seed; a prostate's with a plan
    of its own when N is a multiple of ``OWN_PLAN_EVERY``."""
    number = int(Path(folder).name[3:])
    own_plan = not site.same_as(openkbp()) and number % OWN_PLAN_EVERY == 0
    return write_site_phantom(folder, seed=number, site=site, own_plan=own_plan)
