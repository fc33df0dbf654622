"""Scoring benchmark: prints one JSON object (seconds per patient unless named otherwise).

    python scripts/bench_score.py --data-dir ../shared/openkbp-sample/validation-pats [--patients N]

Predictions are the reference doses perturbed (×U(0.9, 1.1) + 0.5 Gy inside the possible-dose
mask), written as CSVs to a temporary folder. Side by side in one run: the scoring cold (a fresh
cache: parses every reference CSV, then scores); warm (reference patients in the cache, prediction
CSVs parsed); and in memory (predictions already in memory, as --predict-only scores). (The plain
pandas loop the scores are tested against, ``tests/kit/score_loop.py``, is the tests' oracle: a
benchmark does not import the tests.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from provided_code.apps.score_folder import read_prediction, score_prediction_folder
from provided_code.data.cache import load_split
from provided_code.data.csv_io import discover_patients, write_dose_csv
from provided_code.metrics.scoring import score_split
from provided_code.sites import openkbp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="a folder of pt_* patient folders with dose.csv")
    parser.add_argument("--patients", type=int, default=None)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-score-"))
    try:
        split = workdir / "reference"
        split.mkdir()
        for folder in discover_patients(args.data_dir)[: args.patients]:
            (split / folder.name).symlink_to(folder.resolve())
        arrays = load_split(split, cache_dir=workdir / "setup-cache", site=openkbp())
        count = len(arrays)
        rng = np.random.default_rng(0)
        predictions_dir = workdir / "predictions"
        for row, pid in enumerate(arrays.patient_ids):
            noise = rng.uniform(0.9, 1.1, arrays.dose[row].shape).astype(np.float32)
            write_dose_csv(predictions_dir / f"{pid}.csv", arrays.dose[row] * noise + 0.5, arrays.possible_dose_mask[row])

        start = time.perf_counter()
        score_prediction_folder(split, predictions_dir, cache_dir=workdir / "cold-cache", site=openkbp())
        cold_s = (time.perf_counter() - start) / count

        start = time.perf_counter()
        warm = score_prediction_folder(split, predictions_dir, cache_dir=workdir / "cold-cache", site=openkbp())
        warm_s = (time.perf_counter() - start) / count

        in_memory_doses = [read_prediction(predictions_dir, pid) for pid in arrays.patient_ids]
        start = time.perf_counter()
        score_split(arrays, lambda row: in_memory_doses[row])
        memory_s = (time.perf_counter() - start) / count
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(json.dumps({
        "patients": count,
        "cold_s_per_patient": cold_s,
        "warm_s_per_patient": warm_s,
        "in_memory_s_per_patient": memory_s,
        "dose_score": warm.dose_score,
        "dvh_score": warm.dvh_score,
    }, indent=2))


if __name__ == "__main__":
    main()
