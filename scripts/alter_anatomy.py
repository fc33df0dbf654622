#!/usr/bin/env python
"""Real patients with an altered anatomy, for measuring the in-distribution check (issue: prediction
bands and the in-distribution check): copies of a split's patients with

- ``target_grown``: the high-dose target (PTV70) grown by ``--grow-mm`` (20 mm) inside the body;
- ``organ_moved``: the brainstem's contour moved (rigidly, whole voxels) so that its centre lies on
  the high-dose target's centre, inside the body: an organ at risk inside the target.

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

from provided_code.constants import POSSIBLE_DOSE_MASK_FILE, VOLUME_SHAPE, VOXEL_DIMENSIONS_FILE  # noqa: E402
from provided_code.data.csv_io import as_volume, read_sparse_csv, read_voxel_dimensions, write_sparse_csv  # noqa: E402
from provided_code.data_folder import split_dir  # noqa: E402
from provided_code.folds import natural_key  # noqa: E402
from scripts.plant_outliers import _grown  # noqa: E402

TARGET, ORGAN = "PTV70", "Brainstem"
GROWN, MOVED = 10000, 20000  # the altered patients' numbers: N + these


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
        shift = np.round(np.argwhere(target).mean(axis=0) - np.argwhere(organ).mean(axis=0)).astype(int)
        moved = np.zeros_like(organ)
        found = np.argwhere(organ) + shift
        inside = np.all((found >= 0) & (found < np.asarray(VOLUME_SHAPE)), axis=1)
        moved[tuple(found[inside].T)] = True
        moved &= body
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
