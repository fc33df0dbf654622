#!/usr/bin/env python
"""Real patients with an altered anatomy, for measuring the in-distribution check (issue: prediction
bands and the in-distribution check): copies of a split's patients with

- ``target_grown``: the high-dose target (PTV70) grown by ``--grow-mm`` (20 mm) inside the body;
- ``organ_moved``: the brainstem's contour moved (rigidly, whole voxels) so that its centre lies on
  the high-dose target's centre, inside the body: an organ at risk inside the target.

The functions below (``grown_target``, ``moved_into_target``: an organ moved 20 mm towards the
target, ``deleted_organ``, ``shifted_ct``: +300 HU) alter one patient's volumes in memory, as
``scripts/measure_flag.py`` applies them.

    python scripts/alter_anatomy.py DATA_DIR OUT [--split validation] [--grow-mm 20]

OUT/<split>-pats/ gets, for each patient pt_<N> of DATA_DIR's split that has the target (and the
brainstem, for the second), pt_<10000 + N> (target grown) and pt_<20000 + N> (organ moved): a copy
of its folder (links to the unchanged files) with that one structure's file rewritten. The dose is
left as it was (the check reads the anatomy only). Prints JSON: each altered patient, what was
done and how many voxels changed (also written as OUT/altered.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provided_code.constants import CT_MAX, POSSIBLE_DOSE_MASK_FILE, VOLUME_SHAPE, VOXEL_DIMENSIONS_FILE  # noqa: E402
from provided_code.data.csv_io import as_volume, read_sparse_csv, read_voxel_dimensions, write_sparse_csv  # noqa: E402
from provided_code.data_folder import split_dir  # noqa: E402
from provided_code.folds import natural_key  # noqa: E402
from scripts.plant_outliers import _grown  # noqa: E402

TARGET, ORGAN = "PTV70", "Brainstem"
GROWN, MOVED = 10000, 20000  # the altered patients' numbers: N + these
MOVE_MM = 20.0  # moved_20mm: an organ moved this far towards the target
CT_SHIFT_HU = 300  # ct_shifted: the CT inside the body this much brighter
ORGANS = ("Brainstem", "SpinalCord", "RightParotid", "LeftParotid", "Esophagus", "Larynx", "Mandible")


# -- alterations of one patient's volumes (128³ bool masks by structure name, the body, the CT) -----------

def grown_target(target: np.ndarray, body: np.ndarray, spacing, mm: float) -> np.ndarray:
    """The target grown by ``mm`` inside the body."""
    return _grown(target, np.asarray(spacing, float), mm) & body


def moved_into_target(organs: dict, target: np.ndarray, targets: np.ndarray, body: np.ndarray, spacing,
                      mm: float = MOVE_MM) -> tuple[str, np.ndarray]:
    """Of ``organs`` (name: mask), the one that a rigid move of ``mm`` (whole voxels) towards the
    target's centre puts furthest into the targets (the largest gain in its share inside them),
    and its moved mask (inside the body)."""
    spacing = np.asarray(spacing, float)
    centre = np.argwhere(target).mean(axis=0)
    best = None
    for name, organ in organs.items():
        if not organ.any():
            continue
        towards = (centre - np.argwhere(organ).mean(axis=0)) * spacing
        if not np.linalg.norm(towards):
            continue
        step = np.round(towards / np.linalg.norm(towards) * mm / spacing).astype(int)
        moved = np.roll(organ, tuple(step), axis=(0, 1, 2)) & body
        gain = (moved & targets).sum() / max(moved.sum(), 1) - (organ & targets).sum() / organ.sum()
        if best is None or gain > best[0]:
            best = (gain, name, moved)
    return best[1], best[2]


def moved_onto_target(organ: np.ndarray, target: np.ndarray, body: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The organ moved rigidly (whole voxels) so that its centre lies on the target's centre,
    inside the body, and the shift (voxels)."""
    shift = np.round(np.argwhere(target).mean(axis=0) - np.argwhere(organ).mean(axis=0)).astype(int)
    moved = np.zeros_like(organ)
    found = np.argwhere(organ) + shift
    inside = np.all((found >= 0) & (found < np.asarray(organ.shape)), axis=1)
    moved[tuple(found[inside].T)] = True
    return moved & body, shift


def shifted_ct(ct: np.ndarray, body: np.ndarray, hu: int = CT_SHIFT_HU) -> np.ndarray:
    """The CT ``hu`` brighter inside the body (clipped to the format's range)."""
    return np.where(body, np.clip(ct.astype(np.int32) + hu, 0, CT_MAX), ct).astype(ct.dtype)


def deleted_organ(number: int) -> str:
    """The parotid an organ_deleted patient loses: the left for odd patient numbers, else the right."""
    return "LeftParotid" if number % 2 else "RightParotid"


def _mask(path: Path, pid: str) -> np.ndarray:
    indices, _ = read_sparse_csv(path, pid, with_values=False)
    return as_volume(indices, None, bool).reshape(VOLUME_SHAPE)


def _copy(source: Path, out: Path, rewritten: str) -> None:
    """``out`` as a folder of links to ``source``'s files, but ``rewritten`` (written by the caller)."""
    out.mkdir(parents=True)
    for path in source.iterdir():
        if path.name != rewritten:
            os.symlink(path.resolve(), out / path.name)


def _write(folder: Path, name: str, mask: np.ndarray) -> None:
    write_sparse_csv(folder / f"{name}.csv", np.flatnonzero(mask.reshape(-1)), None)


def alter(data_dir: Path, out: Path, split: str, grow_mm: float) -> dict:
    source_split, out_split = split_dir(data_dir, split), split_dir(out, split)
    altered = {}
    for folder in sorted(source_split.glob("pt_*"), key=lambda p: natural_key(p.name)):
        pid, number = folder.name, int(folder.name.split("_")[1])
        if not (folder / f"{TARGET}.csv").is_file():
            continue
        body = _mask(folder / POSSIBLE_DOSE_MASK_FILE, pid)
        target = _mask(folder / f"{TARGET}.csv", pid)
        spacing = np.asarray(read_voxel_dimensions(folder / VOXEL_DIMENSIONS_FILE, pid), float)
        grown = _grown(target, spacing, grow_mm) & body
        name = f"pt_{GROWN + number}"
        _copy(folder, out_split / name, f"{TARGET}.csv")
        _write(out_split / name, TARGET, grown)
        altered[name] = {"from": pid, "alteration": "target_grown",
                         "what": f"{TARGET} grown by {grow_mm:g} mm: {int(grown.sum())} voxels instead of "
                                 f"{int(target.sum())}"}
        if not (folder / f"{ORGAN}.csv").is_file():
            continue
        organ = _mask(folder / f"{ORGAN}.csv", pid)
        moved, shift = moved_onto_target(organ, target, body)
        name = f"pt_{MOVED + number}"
        _copy(folder, out_split / name, f"{ORGAN}.csv")
        _write(out_split / name, ORGAN, moved)
        spacing_mm = np.abs(shift) * spacing
        altered[name] = {"from": pid, "alteration": "organ_moved",
                         "what": f"{ORGAN} moved by {float(np.sqrt((spacing_mm ** 2).sum())):.0f} mm onto {TARGET}'s "
                                 f"centre: {int((moved & target).sum())} of its {int(moved.sum())} voxels inside "
                                 f"{TARGET} (before: {int((organ & target).sum())})"}
    result = {"source": str(data_dir), "out": str(out), "split": split, "altered": altered}
    (out / "altered.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--split", default="validation")
    parser.add_argument("--grow-mm", type=float, default=20.0)
    args = parser.parse_args()
    if args.out.exists():
        raise SystemExit(f"{args.out} exists: choose a new folder")
    args.out.mkdir(parents=True)
    print(json.dumps(alter(args.data_dir, args.out, args.split, args.grow_mm), indent=1))


if __name__ == "__main__":
    main()
