"""Data-layer benchmark: prints one JSON object (seconds unless named otherwise).

    python scripts/bench_data.py --data-dir ../shared/openkbp-sample/train-pats [--patients N]

Side by side on the same patients, in one run: CSV parse per patient; cache build per patient
(parallel over the machine's cores); cache-to-arrays load and RAM per patient; batch assembly
(batch 2 at 128³, what the model consumes); the same batch from a naive loader that re-reads the
CSVs into float64 every batch (the approach this design replaces); and a plain numpy copy of the
batch's bytes (the memory-bandwidth limit). The cache goes to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from provided_code.constants import (
    CT_FILE, DOSE_FILE, NUM_VOXELS, POSSIBLE_DOSE_MASK_FILE, STRUCTURES, VOLUME_SHAPE,
)
from provided_code.data.batches import epoch_batches, take_batch
from provided_code.data.cache import build_cache, cache_path_for, load_cache, source_fingerprint
from provided_code.data.csv_io import discover_patients, read_patient


def timed(function, repeats: int) -> float:
    """Median wall time of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def naive_batch(folders: list[Path]):
    """What the design replaces: parse the CSVs of every patient of the batch into float64.

    The dense volumes are allocated with np.full, not np.zeros, so that their pages exist: a model
    fed this batch reads every byte of it, as it reads every byte of the compact batch.
    """
    shape = (len(folders), *VOLUME_SHAPE)
    ct = np.full((*shape, 1), 0.0)
    masks = np.full((*shape, len(STRUCTURES) + 1), 0.0)
    dose = np.full((*shape, 1), 0.0)
    for row, folder in enumerate(folders):
        for name, target, channel in [(CT_FILE, ct, 0), (DOSE_FILE, dose, 0)]:
            frame = pd.read_csv(folder / name, index_col=0)
            target[row].reshape(NUM_VOXELS, -1)[frame.index.to_numpy(), channel] = frame["data"].to_numpy()
        for channel, name in enumerate([*STRUCTURES, POSSIBLE_DOSE_MASK_FILE[:-4]]):
            path = folder / f"{name}.csv"
            if path.exists():
                masks[row].reshape(NUM_VOXELS, -1)[pd.read_csv(path, index_col=0).index.to_numpy(), channel] = 1
    return ct, masks, dose


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True, type=Path, help="a folder of pt_* patient folders")
    parser.add_argument("--patients", type=int, default=None, help="use the first N patients (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    folders = discover_patients(args.data_dir)[: args.patients]
    count = len(folders)
    workdir = Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        # The split as the benchmark sees it: links to the chosen patients, cache in workdir.
        split = workdir / "split"
        split.mkdir()
        for folder in folders:
            (split / folder.name).symlink_to(folder.resolve())
        folders = discover_patients(split)

        start = time.perf_counter()
        for folder in folders:
            read_patient(folder)
        parse_s = (time.perf_counter() - start) / count

        path = cache_path_for(split, workdir / "cache")
        start = time.perf_counter()
        build_cache(split, path, folders, source_fingerprint(folders), skip_incomplete=False)
        build_s = (time.perf_counter() - start) / count

        load_cache(path)  # warm the page cache, as a second epoch or run would see it
        # with and without the per-chunk checksums, alternating, median of each
        checked, plain = [], []
        for _ in range(9):
            checked.append(timed(lambda: load_cache(path), repeats=1))
            plain.append(timed(lambda: load_cache(path, verify=False), repeats=1))
        load_s = float(np.median(checked)) / count
        load_plain_s = float(np.median(plain)) / count
        arrays = load_cache(path)
        ram_mb = arrays.nbytes / count / 1e6

        rows = epoch_batches(count, 2, seed=0, epoch=0)[0]
        batch_s = timed(lambda: take_batch(arrays, rows), args.repeats)
        inputs, dose = take_batch(arrays, rows)
        batch_bytes = sum(a.nbytes for a in inputs.values()) + dose.nbytes
        source = np.ones(batch_bytes, np.uint8)
        copy_s = timed(lambda: source.copy(), args.repeats)
        naive_s = timed(lambda: naive_batch([folders[i] for i in rows]), repeats=2)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(json.dumps({
        "patients": count,
        "csv_parse_s_per_patient": parse_s,
        "cache_build_s_per_patient": build_s,
        "cache_load_s_per_patient": load_s,
        "cache_load_plain_s_per_patient": load_plain_s,
        "cache_load_checksum_over_plain": load_s / load_plain_s,
        "ram_mb_per_patient": ram_mb,
        "batch_s": batch_s,
        "naive_batch_s": naive_s,
        "copy_limit_s": copy_s,
        "batch_mb": batch_bytes / 1e6,
        "naive_over_batch": naive_s / batch_s,
        "batch_over_copy_limit": batch_s / copy_s,
        "parse_over_load": parse_s / load_s,
    }, indent=2))


if __name__ == "__main__":
    main()
