"""Data-layer benchmark: prints one JSON object (seconds unless named otherwise).

    python scripts/bench_data.py --data-dir ../shared/openkbp-sample/train-pats [--patients N]
    python scripts/bench_data.py --data-dir ../shared/openkbp-sample/train-pats --part csv

``--part csv`` alone: writing the first patient's CT (every non-zero voxel) and its dose (every voxel
of the possible-dose mask) as sparse CSVs with ``write_sparse_csv``, against the same lines composed
one Python string a voxel (how it wrote them before), alternating, processor seconds (medians of
``--repeats``), and whether both wrote the same bytes.

Side by side on the same patients, in one run: CSV parse per patient; cache build per patient
(parallel over the machine's cores); cache-to-arrays load and RAM per patient; batch assembly
(batch 2 at 128³, what the model consumes); the same batch from a naive loader that re-reads the
CSVs into float64 every batch (the approach this design replaces); and a plain numpy copy of the
batch's bytes (the memory-bandwidth limit); writing a patient's dose CSV, and zipping it at the
submission's deflate level against zlib's default. The cache goes to a temporary folder.

Memory-mapped training (``--memory-map``, ``data/mapped.py``), also in the same run:

- ``batch_s_memory_map_warm_over_in_memory``: the same batch from the cache file mapped into
  memory, its pages in the page cache and its chunks already verified (every epoch after the
  first, for a cohort the page cache holds), over the batch from the arrays in memory; beside it
  ``batch_s_memory_map_cold``: a fresh mapping after ``posix_fadvise(DONTNEED)`` dropped the file
  from the page cache (chunks verified: a cohort larger than the page cache, from its second epoch);
- ``train_peak_rss_mb_memory_map``: the peak resident memory (VmHWM) of a process that trains a
  few 128³ steps (``--preset v2``'s generator, whose figures docs/performance.md records;
  ``--rss-filters`` filters, batch 1, the masked loss, the project's input
  pipeline and step) on a phantom cohort of ``--cohort-patients`` patients mapped from its cache
  (the cohort is a few phantoms, each under many patient numbers), with
  ``cohort_stacked_over_peak_rss`` (the cohort's stacked arrays over that peak: at least 4 asked);
  beside it the same steps in a process that holds only the touched patients in memory, whose
  losses must be the same (``losses_equal``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from provided_code.infra.environment import cpu_flags
from provided_code.sites import openkbp
from provided_code.constants import (
    CT_FILE, DOSE_FILE, NUM_VOXELS, POSSIBLE_DOSE_MASK_FILE, VOLUME_SHAPE,
)
from provided_code.data.batches import epoch_batches, take_batch
from provided_code.model_spec import model_inputs
from provided_code.data.cache import build_cache, cache_path_for, load_cache, load_split, source_fingerprint
from provided_code.data.csv_io import discover_patients, read_patient
from provided_code.data.split_arrays import VOLUME_NAMES, stacked_nbytes

VOLUMES = model_inputs(openkbp())  # what an OpenKBP model eats: the CT and the packed structures

REPO = Path(__file__).resolve().parents[1]


def csv_and_zip(arrays, workdir: Path, repeats: int) -> dict:
    """Writing a patient's dose as the challenge's CSV (``write_dose_csv``: every voxel of the
    possible-dose mask), and zipping it as ``--predict-only`` zips a submission
    (``SUBMISSION_ZIP_LEVEL``) against zlib's default level 6, alternating: times and sizes."""
    import zipfile

    from provided_code.apps.predict import SUBMISSION_ZIP_LEVEL
    from provided_code.data.csv_io import write_dose_csv

    path = workdir / "dose.csv"
    write_s = timed(lambda: write_dose_csv(path, arrays.dose[0], arrays.possible_dose_mask[0]), repeats)
    times, sizes = {SUBMISSION_ZIP_LEVEL: [], 6: []}, {}
    for _ in range(repeats):
        for level in times:
            target = workdir / f"level-{level}.zip"
            start = time.perf_counter()
            with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level) as archive:
                archive.write(path, arcname="pt_1.csv")
            times[level].append(time.perf_counter() - start)
            sizes[level] = target.stat().st_size
    ours, default = statistics.median(times[SUBMISSION_ZIP_LEVEL]), statistics.median(times[6])
    return {"csv_write_s_per_patient": write_s, "submission_zip_level": SUBMISSION_ZIP_LEVEL,
            "submission_zip_s": ours, "submission_zip_level_6_s": default,
            "submission_zip_level_6_over_ours_s": default / ours,
            "submission_zip_bytes_ours_over_level_6": sizes[SUBMISSION_ZIP_LEVEL] / sizes[6]}


def line_per_voxel(path: Path, indices, values) -> None:
    """The sparse CSV as write_sparse_csv composed it before: one Python string a voxel."""
    index_list = np.asarray(indices, dtype=np.int64).tolist()
    value_list = [""] * len(index_list) if values is None else np.asarray(values).astype(str).tolist()
    path.write_text(",data\n" + "".join(f"{i},{v}\n" for i, v in zip(index_list, value_list, strict=True)))


def csv_writing(folder: Path, workdir: Path, repeats: int) -> dict:
    """``--part csv``: one patient's CT and dose written both ways, alternating (processor seconds)."""
    from provided_code.data.csv_io import write_sparse_csv

    patient = read_patient(folder, site=openkbp())
    ct, dose = patient.ct.reshape(-1), patient.dose.reshape(-1)
    listed = np.flatnonzero(patient.possible_dose_mask.reshape(-1))
    volumes = {"ct": (np.flatnonzero(ct), ct[ct != 0]), "dose": (listed, dose[listed])}
    figures = {"patient": folder.name}
    for name, (indices, values) in volumes.items():
        times = {"columns": [], "line_per_voxel": []}
        for _ in range(repeats):
            for way, write in (("columns", write_sparse_csv), ("line_per_voxel", line_per_voxel)):
                start = time.process_time()
                write(workdir / f"{name}-{way}.csv", indices, values)
                times[way].append(time.process_time() - start)
        ours, before = statistics.median(times["columns"]), statistics.median(times["line_per_voxel"])
        figures.update({f"{name}_lines": len(indices), f"{name}_write_s": ours, f"{name}_line_per_voxel_s": before,
                        f"{name}_line_per_voxel_over_ours": before / ours,
                        f"{name}_same_bytes": (workdir / f"{name}-columns.csv").read_bytes() ==
                        (workdir / f"{name}-line_per_voxel.csv").read_bytes()})
    return figures


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
    masks = np.full((*shape, len(openkbp().names) + 1), 0.0)
    dose = np.full((*shape, 1), 0.0)
    for row, folder in enumerate(folders):
        for name, target, channel in [(CT_FILE, ct, 0), (DOSE_FILE, dose, 0)]:
            frame = pd.read_csv(folder / name, index_col=0)
            target[row].reshape(NUM_VOXELS, -1)[frame.index.to_numpy(), channel] = frame["data"].to_numpy()
        for channel, name in enumerate([*openkbp().names, POSSIBLE_DOSE_MASK_FILE[:-4]]):
            path = folder / f"{name}.csv"
            if path.exists():
                masks[row].reshape(NUM_VOXELS, -1)[pd.read_csv(path, index_col=0).index.to_numpy(), channel] = 1
    return ct, masks, dose


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget ``path``'s pages (those no process maps)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def memory_map_batches(path: Path, arrays, rows, repeats: int) -> dict:
    """A batch from the mapped cache file, warm and cold, against the same batch from ``arrays``
    (in memory): warm and in memory alternating, the median of each."""
    mapped = load_cache(path, mapped=True, site=openkbp())
    take_batch(mapped, rows, VOLUMES)  # first touch: read and verified
    warm, in_memory = [], []
    for _ in range(max(9, repeats)):
        warm.append(timed(lambda: take_batch(mapped, rows, VOLUMES), 1))
        in_memory.append(timed(lambda: take_batch(arrays, rows, VOLUMES), 1))
    warm_s, in_memory_s = float(np.median(warm)), float(np.median(in_memory))
    cold = []
    for _ in range(repeats):
        del mapped
        gc.collect()  # unmapped: the kernel drops only pages no process maps
        drop_from_page_cache(path)
        mapped = load_cache(path, mapped=True, site=openkbp())
        cold.append(timed(lambda: take_batch(mapped, rows, VOLUMES), 1))
    return {"batch_s_in_memory": in_memory_s, "batch_s_memory_map_warm": warm_s,
            "batch_s_memory_map_cold": float(np.median(cold)),
            "batch_s_memory_map_warm_over_in_memory": warm_s / in_memory_s,
            "batch_s_memory_map_cold_over_in_memory": float(np.median(cold)) / in_memory_s}


# -- peak memory of training from a mapped cohort (each process a measurement of its own) ------------
def child_train_rss(spec: dict) -> dict:
    """A few 128³ training steps on the cohort cached at ``spec["cache"]``: mapped, or (``mapped``
    false) with only the steps' patients read into memory. Losses and the process's peak RSS."""
    from provided_code.infra.environment import configure_tensorflow

    configure_tensorflow()
    import keras
    import tensorflow as tf

    from provided_code.config import TrainConfig
    from provided_code.data.tf_dataset import distributed_dataset, update_schedule
    from provided_code.losses import loss_function, needs_possible_dose_mask
    from provided_code.presets import preset_network
    from provided_code.training.memory import peak_rss_mb
    from provided_code.training.model import new_model
    from provided_code.training.step import TrainStep

    tf.config.experimental.enable_op_determinism()  # as training on a CPU without XLA: the same losses
    strategy = tf.distribute.get_strategy()
    cohort = load_cache(Path(spec["cache"]), mapped=True, site=openkbp())
    config = TrainConfig(**{**preset_network("v2"), "resolution": 128, "filters": spec["filters"]}, batch_size=1, augment="none",
                         xla="off")
    schedule = update_schedule(len(cohort), 1, 1, 1, seed=0, first_epoch=0, epochs=1)[:spec["steps"]]
    arrays = cohort
    if not spec["mapped"]:  # the steps' patients only, read into memory; the rows renumbered
        touched = np.unique(np.concatenate([rows.reshape(-1) for rows, *_ in schedule]))
        part = cohort.select(touched)
        arrays = dataclasses.replace(part, **{name: getattr(part, name)[:] for name in VOLUME_NAMES})
        schedule = [(np.searchsorted(touched, rows), weights, epoch, index) for rows, weights, epoch, index in schedule]
    del cohort
    keras.utils.set_random_seed(0)
    model = new_model(config.spec, config.learning_rate)
    model.optimizer.build(model.trainable_variables)
    step = TrainStep(model, strategy, 1, xla=False, spec=config.spec,
                     loss_fn=loss_function(config.loss, config.dvh_weight, config.spec))
    dataset = distributed_dataset(strategy, arrays, schedule, config.spec,
                                  with_mask=needs_possible_dose_mask(config.loss))
    losses = [float(step.train(element)) for element in dataset]
    return {"losses": losses, "peak_rss_mb": peak_rss_mb(), "memory_mapped": arrays.memory_mapped}


def measure(spec: dict) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                            env=env, cwd=REPO)
    if result.returncode != 0:
        raise SystemExit(f"measurement {spec} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def train_peak_rss(workdir: Path, patients: int, distinct: int, filters: int, steps: int) -> dict:
    """A phantom cohort of ``patients`` (``distinct`` phantoms, each under many patient numbers),
    cached; the mapped and the in-memory steps on it, each in its own process."""
    from provided_code.data.phantoms import write_phantom_split

    write_phantom_split(workdir / "phantoms", distinct)
    originals = discover_patients(workdir / "phantoms")
    cohort = workdir / "cohort"
    cohort.mkdir()
    for number in range(1, patients + 1):
        (cohort / f"pt_{number}").symlink_to(originals[number % distinct].resolve())
    start = time.perf_counter()
    # built (in a pool from 32 patients), not read
    load_split(cohort, cache_dir=workdir / "cohort-cache", memory_map=True, site=openkbp())
    build_s = time.perf_counter() - start
    path = cache_path_for(cohort, workdir / "cohort-cache", site=openkbp())
    spec = {"kind": "train_rss", "cache": str(path), "filters": filters, "steps": steps}
    mapped = measure({**spec, "mapped": True})
    in_memory = measure({**spec, "mapped": False})
    stacked_mb = stacked_nbytes(patients, site=openkbp()) / 2**20
    return {"cohort_patients": patients, "cohort_stacked_mb": stacked_mb, "cohort_cache_build_s": build_s,
            "train_peak_rss_mb_memory_map": mapped["peak_rss_mb"],
            "cohort_stacked_over_peak_rss": stacked_mb / mapped["peak_rss_mb"],
            "train_peak_rss_mb_in_memory_touched_patients": in_memory["peak_rss_mb"],
            "train_losses_memory_map": mapped["losses"], "train_losses_in_memory": in_memory["losses"],
            "losses_equal": mapped["losses"] == in_memory["losses"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, help="a folder of pt_* patient folders (required)")
    parser.add_argument("--patients", type=int, default=None, help="use the first N patients (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cohort-patients", type=int, default=300,
                        help="patients of the phantom cohort of train_peak_rss_mb_memory_map (0: skip it)")
    parser.add_argument("--rss-filters", type=int, default=4, help="filters of its model")
    parser.add_argument("--rss-steps", type=int, default=3, help="its training steps")
    parser.add_argument("--part", choices=["all", "csv"], default="all",
                        help="csv: only the sparse CSV writer against one string a voxel")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child_train_rss(json.loads(args.child))))
        return
    if args.data_dir is None:
        parser.error("the following arguments are required: --data-dir")

    folders = discover_patients(args.data_dir)[: args.patients]
    if args.part == "csv":
        with tempfile.TemporaryDirectory(prefix="bench-csv-") as workdir:
            print(json.dumps({"cpu_flags": cpu_flags(), "cores": len(os.sched_getaffinity(0)),
                              **csv_writing(folders[0], Path(workdir), args.repeats)}, indent=2))
        return
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
            read_patient(folder, site=openkbp())
        parse_s = (time.perf_counter() - start) / count

        path = cache_path_for(split, workdir / "cache", site=openkbp())
        start = time.perf_counter()
        build_cache(split, path, folders, source_fingerprint(folders), skip_incomplete=False, site=openkbp())
        build_s = (time.perf_counter() - start) / count

        load_cache(path, site=openkbp())  # warm the page cache, as a second epoch or run would see it
        # with and without the per-chunk checksums, alternating, median of each
        checked, plain = [], []
        for _ in range(9):
            checked.append(timed(lambda: load_cache(path, site=openkbp()), repeats=1))
            plain.append(timed(lambda: load_cache(path, verify=False, site=openkbp()), repeats=1))
        load_s = float(np.median(checked)) / count
        load_plain_s = float(np.median(plain)) / count
        arrays = load_cache(path, site=openkbp())
        ram_mb = arrays.nbytes / count / 1e6

        rows = epoch_batches(count, 2, seed=0, epoch=0)[0]
        batch_s = timed(lambda: take_batch(arrays, rows, VOLUMES), args.repeats)
        inputs, dose = take_batch(arrays, rows, VOLUMES)
        batch_bytes = sum(a.nbytes for a in inputs.values()) + dose.nbytes
        source = np.ones(batch_bytes, np.uint8)
        copy_s = timed(lambda: source.copy(), args.repeats)
        naive_s = timed(lambda: naive_batch([folders[i] for i in rows]), repeats=2)
        mapped_batches = memory_map_batches(path, arrays, rows, args.repeats)
        writing = csv_and_zip(arrays, workdir, args.repeats)
        del arrays
        training = (train_peak_rss(workdir, args.cohort_patients, 4, args.rss_filters, args.rss_steps)
                    if args.cohort_patients else {})
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
        **mapped_batches,
        **writing,
        **training,
    }, indent=2))


if __name__ == "__main__":
    main()
