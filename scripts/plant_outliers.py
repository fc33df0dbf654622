#!/usr/bin/env python
"""Plant three plans a physicist would catch into a copy of a data folder, for measuring what
commissioning flags (issue: commissioning's planted outliers).

    python scripts/plant_outliers.py DATA_DIR OUT [--seed 0] [--patients pt_a,pt_b,pt_c]

OUT is a data folder of symbolic links to DATA_DIR's patients, but for three training patients
(chosen by ``--seed`` among those with both parotids, or named) copied and changed:

- ``dose_scaled``: the whole dose × 0.85 (a plan normalised wrong: every target under-covered);
- ``organ_hot``: the dose inside the left parotid raised by 10 Gy (a plan that spared it much less);
- ``contour_swapped``: the right parotid's contour replaced by a far larger region (the parotid
  grown by 25 mm, inside the body): a contouring error, the plan itself unchanged.

Prints JSON: the planted patients and what was done to each (also written as OUT/planted.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provided_code.constants import DOSE_FILE, POSSIBLE_DOSE_MASK_FILE, VOLUME_SHAPE, VOXEL_DIMENSIONS_FILE  # noqa: E402
from provided_code.data.csv_io import (as_volume, read_sparse_csv, read_voxel_dimensions,  # noqa: E402
                                       write_sparse_csv)
from provided_code.data_folder import SPLITS, split_dir  # noqa: E402
from provided_code.folds import natural_key  # noqa: E402

SCALE = 0.85
HOT_GY = 10.0
HOT_ORGAN, SWAPPED_ORGAN = "LeftParotid", "RightParotid"
GROWN_MM = 25.0


def _link_copy(source: Path, out: Path) -> None:
    for split in SPLITS:
        folder = split_dir(source, split)
        if not folder.is_dir():
            continue
        split_dir(out, split).mkdir(parents=True, exist_ok=True)
        for patient in sorted(folder.glob("pt_*"), key=lambda p: natural_key(p.name)):
            target = split_dir(out, split) / patient.name
            if not target.exists():
                target.symlink_to(patient.resolve(), target_is_directory=True)


def _own_copy(out: Path, pid: str) -> Path:
    """The patient's folder in ``out`` as a real copy (not a link), to change."""
    folder = split_dir(out, "train") / pid
    source = folder.resolve()
    folder.unlink()
    shutil.copytree(source, folder)
    return folder


def _grown(mask: np.ndarray, spacing: np.ndarray, mm: float) -> np.ndarray:
    """``mask`` grown by ``mm`` (an ellipsoidal neighbourhood in voxels of ``spacing``)."""
    reach = np.floor(mm / spacing).astype(int)
    grown = mask.copy()
    for di in range(-reach[0], reach[0] + 1):
        for dj in range(-reach[1], reach[1] + 1):
            for dk in range(-reach[2], reach[2] + 1):
                if (di * spacing[0]) ** 2 + (dj * spacing[1]) ** 2 + (dk * spacing[2]) ** 2 > mm ** 2:
                    continue
                grown |= np.roll(mask, (di, dj, dk), axis=(0, 1, 2))
    return grown


def plant(source: Path, out: Path, seed: int, patients: list[str] | None) -> dict:
    _link_copy(source, out)
    candidates = sorted((p.name for p in split_dir(source, "train").glob("pt_*")
                         if (p / f"{HOT_ORGAN}.csv").is_file() and (p / f"{SWAPPED_ORGAN}.csv").is_file()),
                        key=natural_key)
    chosen = patients or [candidates[i] for i in np.random.default_rng(seed).choice(len(candidates), 3,
                                                                                      replace=False)]
    planted = {}
    scaled, hot, swapped = chosen
    folder = _own_copy(out, scaled)
    indices, values = read_sparse_csv(folder / DOSE_FILE, scaled, with_values=True)
    write_sparse_csv(folder / DOSE_FILE, indices, (values * SCALE).astype(np.float32))
    planted[scaled] = {"plant": "dose_scaled", "what": f"the whole dose × {SCALE}"}

    folder = _own_copy(out, hot)
    indices, values = read_sparse_csv(folder / DOSE_FILE, hot, with_values=True)
    organ, _ = read_sparse_csv(folder / f"{HOT_ORGAN}.csv", hot, with_values=False)
    dose = as_volume(indices, values, np.float64).reshape(-1)
    mask, _ = read_sparse_csv(folder / POSSIBLE_DOSE_MASK_FILE, hot, with_values=False)
    inside = np.intersect1d(organ, mask)
    dose[inside] += HOT_GY
    kept = np.flatnonzero(dose)
    write_sparse_csv(folder / DOSE_FILE, kept, dose[kept].astype(np.float32))
    planted[hot] = {"plant": "organ_hot", "what": f"{HOT_ORGAN}'s dose + {HOT_GY:g} Gy ({inside.size} voxels)"}

    folder = _own_copy(out, swapped)
    organ, _ = read_sparse_csv(folder / f"{SWAPPED_ORGAN}.csv", swapped, with_values=False)
    body, _ = read_sparse_csv(folder / POSSIBLE_DOSE_MASK_FILE, swapped, with_values=False)
    spacing = read_voxel_dimensions(folder / VOXEL_DIMENSIONS_FILE, swapped)
    grown = _grown(as_volume(organ, None, bool).reshape(VOLUME_SHAPE), np.asarray(spacing, float), GROWN_MM).reshape(-1)
    region = np.intersect1d(np.flatnonzero(grown), body)
    write_sparse_csv(folder / f"{SWAPPED_ORGAN}.csv", region, None)
    planted[swapped] = {"plant": "contour_swapped", "what": f"{SWAPPED_ORGAN} grown by {GROWN_MM:g} mm: "
                                                            f"{region.size} voxels instead of {organ.size}"}
    result = {"source": str(source), "out": str(out), "seed": seed, "planted": planted}
    (out / "planted.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--patients", default=None, help="three training patients, comma-separated: "
                                                         "scaled, hot, swapped")
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: choose a new folder")
    patients = args.patients.split(",") if args.patients else None
    print(json.dumps(plant(args.data_dir, args.out, args.seed, patients), indent=1))


if __name__ == "__main__":
    main()
