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
    PRESCRIPTIONS_GY,
    VOLUME_SHAPE,
    VOXEL_DIMENSIONS_FILE,
)
from provided_code.data.csv_io import write_sparse_csv
from provided_code.infra.atomic import write_text_atomic


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
    for name, prescription in PRESCRIPTIONS_GY.items():
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
    folder = Path(folder)
    volumes = make_phantom(seed)
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
