#!/usr/bin/env python
"""How long ``openkbp-commission`` takes by itself (no training, no prediction): a cross-validated
model of N patients at 128³ is laid out as its folds would leave it, and commissioning is timed.

    python scripts/bench_commission.py --data-dir DIR [--patients 200] [--folds 5] [--workdir W]

The N patients are DIR's training patients under N patient numbers (repeated in turn, as symbolic
links); each fold's out-of-fold predictions are the plan's dose, perturbed (× 0.95 and ±2 Gy of
noise, inside the possible-dose mask), written as the folds write them. The timings: the cache's
first build of the N patients (what any first run on the data pays), then commissioning twice on a
warm cache (the command's own time: reading the predictions, the DVH tables, the anatomy, the
report). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provided_code.config import TrainConfig  # noqa: E402
from provided_code.data.cache import load_split  # noqa: E402
from provided_code.data.csv_io import exact_dose, write_dose_csv  # noqa: E402
from provided_code.data_folder import split_dir  # noqa: E402
from provided_code.folds import (HELD_OUT_STAGE, MADE_WITH, SPLITS_FILE, deal, fold_dir, held_out_record,  # noqa: E402
                                 natural_key)
from provided_code.infra.checksum import file_checksum  # noqa: E402
from provided_code.run_folder import RunFolder  # noqa: E402
from provided_code.sites import openkbp  # noqa: E402


def lay_out(data_dir: Path, workdir: Path, patients: int, folds: int) -> tuple[Path, Path, Path]:
    """``(data, model, cache)``: N patients as links, their cache, and a model folder as N folds leave it."""
    sources = sorted(split_dir(data_dir, "train").glob("pt_*"), key=lambda p: natural_key(p.name))
    data = workdir / "data"
    train = split_dir(data, "train")
    train.mkdir(parents=True, exist_ok=True)
    for number in range(1, patients + 1):
        link = train / f"pt_{number}"
        if not link.exists():
            link.symlink_to(sources[(number - 1) % len(sources)].resolve(), target_is_directory=True)
    return data, workdir / "results" / "cv", workdir / "cache"


def write_folds(arrays, model: Path, folds: int) -> None:
    dealing = deal(arrays.patient_ids, folds, seed=0, source=str(arrays.folder))
    model.mkdir(parents=True, exist_ok=True)
    (model / SPLITS_FILE).write_text(json.dumps(dealing.to_dict(), indent=1) + "\n")
    rng = np.random.default_rng(0)
    for k in range(1, folds + 1):
        folder = RunFolder(fold_dir(model, k))
        folder.models.mkdir(parents=True, exist_ok=True)
        folder.write_config(TrainConfig(folds=folds, fold=k, epochs=1, resolution=64, filters=16, model_name="cv",
                                        results_dir=str(model.parent)))
        with zipfile.ZipFile(folder.checkpoint(1), "w") as stand_in:  # stands for a checkpoint: a zip archive, as
            stand_in.writestr("stand-in", os.urandom(1 << 20))         # opening a fold checks (checksummed by the card)
        out = folder.predictions(HELD_OUT_STAGE)
        out.mkdir(parents=True, exist_ok=True)
        held = set(dealing.held_out_of(k))
        for row, pid in enumerate(arrays.patient_ids):
            if pid not in held:
                continue
            mask = arrays.possible_dose_mask[row]
            plan = exact_dose(arrays.dose[row], int(arrays.dose_decimals[row]))
            noisy = np.clip(plan * 0.95 + rng.uniform(-2, 2, plan.shape), 0, None).astype(np.float32)
            write_dose_csv(out / f"{pid}.csv", noisy, mask)
        made_with = held_out_record(folder.checkpoint(1), 1, file_checksum(folder.checkpoint(1)), out, sorted(held),
                                    arrays.sources_of())
        (out / "scores.json").write_text(json.dumps({"epoch": 1, "dose_score": 0.0, "dvh_score": 0.0,
                                                     "patients": len(held), MADE_WITH: made_with}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--patients", type=int, default=200)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    from provided_code.apps.commission import run
    from provided_code.apps.commission.run import commission

    run._check_loads = lambda number, member: None  # the stand-ins for checkpoints are not models: their loading is not measured

    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch)
        data, model, cache = lay_out(args.data_dir, workdir, args.patients, args.folds)
        start = time.perf_counter()
        arrays = load_split(split_dir(data, "train"), cache_dir=cache, site=openkbp())
        cache_s = time.perf_counter() - start
        write_folds(arrays, model, args.folds)
        del arrays
        runs = []
        for _ in range(2):
            start = time.perf_counter()
            commission(model, data_dir=data, cache_dir=cache)
            runs.append(time.perf_counter() - start)
        print(json.dumps({
            "patients": args.patients, "folds": args.folds, "machine": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "cache_build_s": round(cache_s, 2),
            "commission_s": [round(s, 2) for s in runs], "commission_s_per_patient": round(min(runs) / args.patients, 3)}, indent=1))


if __name__ == "__main__":
    main()
