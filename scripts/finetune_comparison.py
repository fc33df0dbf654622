#!/usr/bin/env python
"""A small clinic's cohort trained from scratch against fine-tuned from a model trained on other
patients (``--init-from``), the same number of updates each (docs/recipe.md, "Fine-tuning a small
cohort"): prints JSON, and the Markdown table on stderr.

The data: make-data-dir.sh's folder (55 training patients, 30 validation patients with doses) dealt
once by a seeded shuffle into a parent's cohort (``--parent-patients``, 35) and the others, of which
the clinics take the first 10 and 20 (``--clinics``; the smaller clinic's patients are among the
larger's). Each is a folder of symlinks under ``<work>/data/`` whose ``validation-pats`` is one
shared folder (one cache): ``parent/``, ``clinic-10/``, ``clinic-20/``. Nothing is copied.

The runs (``<work>/results/``): the parent, then, for every clinic and seed, each arm (``ARMS``:
scratch, fine-tuned at ``--preset v2``'s rate (2e-4), fine-tuned at lower rates after a short warm-up, with and
without the encoder frozen at first), every one ``--updates`` updates long (so the epochs of a
clinic of N patients are updates / ceil(N / batch)), scored every ``--score-updates`` updates.
The arms of one clinic and seed are queued one after another, alternating, two runs at a time on
their own cores (``--jobs 2``), so that whatever else the machine does falls on every arm alike.
Runs already finished are read back, not trained again; an unfinished one resumes (without
``--init-from``: a resume never loads the parent again).

``--cross-site N``: also N prostate phantoms (``<work>/data/prostate/``, written once) trained from
scratch and fine-tuned from the OpenKBP parent (another site: the first convolution's input
channels differ), a few epochs each, for their first epochs' losses and what was taken.

    bash ../shared/openkbp-more/make-data-dir.sh /tmp/openkbp-55
    python scripts/finetune_comparison.py --data-dir /tmp/openkbp-55 --work /tmp/tune --jobs 2 \\
        --cross-site 20 > finetune.json
"""

from __future__ import annotations

import csv
import json
import math
import os
import queue
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
SCRATCH = "scratch"
# arm -> its flags beyond the common ones ({parent}: the parent's run folder; {freeze}: epochs)
ARMS = {
    SCRATCH: ["--preset", "v2"],
    "tuned-2e-4": ["--preset", "v2", "--init-from", "{parent}"],
    "tuned-1e-4-warm": ["--preset", "v2", "--init-from", "{parent}", "--learning-rate", "1e-4",
                        "--warmup-epochs", "2"],
    "tuned-5e-5-warm": ["--preset", "v2", "--init-from", "{parent}", "--learning-rate", "5e-5",
                        "--warmup-epochs", "2"],
    "tuned-5e-5-warm-freeze": ["--preset", "v2", "--init-from", "{parent}", "--learning-rate", "5e-5",
                               "--warmup-epochs", "2", "--freeze", "encoder", "--freeze-epochs", "{freeze}"],
}


def deal(data_dir: Path, parent_patients: int, seed: int) -> tuple[list[str], list[str]]:
    """``(parent's, others)``: the training patients of ``data_dir`` shuffled once by ``seed``."""
    patients = sorted((path.name for path in (data_dir / "train-pats").iterdir() if path.name.startswith("pt_")),
                      key=lambda name: int(name.split("_")[1]))
    random.Random(seed).shuffle(patients)
    return patients[:parent_patients], patients[parent_patients:]


def symlink_farm(folder: Path, source: Path, patients: list[str], validation: Path) -> Path:
    """``folder/train-pats/<patient>`` linked to ``source``'s, and ``folder/validation-pats`` linked to
    ``validation`` (made once; a farm that exists must hold exactly these patients)."""
    train = folder / "train-pats"
    if train.is_dir():
        have = sorted(path.name for path in train.iterdir())
        if have != sorted(patients):
            raise click.ClickException(f"{train} holds other patients than this dealing's: remove {folder}")
        return folder
    train.mkdir(parents=True)
    for name in patients:
        os.symlink((source / "train-pats" / name).resolve(), train / name)
    os.symlink(validation, folder / "validation-pats")
    return folder


def validation_farm(folder: Path, source: Path) -> Path:
    if not folder.is_dir():
        folder.mkdir(parents=True)
        for path in sorted((source / "validation-pats").iterdir()):
            os.symlink(path.resolve(), folder / path.name)
    return folder


def read_log(log: Path) -> list[dict]:
    if not log.is_file():
        return []
    with open(log, newline="") as handle:
        return list(csv.DictReader(handle))


def finished(run_dir: Path, epochs: int) -> bool:
    rows = read_log(run_dir / "training_log.csv")
    return bool(rows) and max(int(row["epoch"]) for row in rows) >= epochs


def scored(rows: list[dict]) -> list[tuple[int, float, float]]:
    return [(int(row["epoch"]), float(row["val_dose_score"]), float(row["val_dvh_score"])) for row in rows
            if row["val_dose_score"]]


def run_record(run_dir: Path, updates_per_epoch: int) -> dict:
    rows = read_log(run_dir / "training_log.csv")
    scores = scored(rows)
    best = min(scores, key=lambda row: row[1])
    config = json.loads((run_dir / "models" / "config.json").read_text())
    return {"best_epoch": best[0], "best_dose_score": best[1], "best_dvh_score": best[2],
            "last_epoch": scores[-1][0], "last_dose_score": scores[-1][1], "last_dvh_score": scores[-1][2],
            "first_epoch_loss": float(rows[0]["loss"]), "updates_per_epoch": updates_per_epoch,
            "curve": [[epoch, round(dose, 3)] for epoch, dose, _ in scores],
            "seconds": round(sum(float(row["epoch_seconds"]) for row in rows)),
            "parent": {key: config["parent"].get(key) for key in ("model", "epoch", "checkpoint", "sha256", "taken",
                                                                  "not_taken")} if config.get("parent") else None}


def epochs_to_reach(curve: list[list], target: float) -> int | None:
    """The first scored epoch at or below ``target`` (None: never), both as the curve rounds them."""
    return next((epoch for epoch, dose in curve if dose <= round(target, 3)), None)


def summarise(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


class Lanes:
    """``jobs`` runs at once; with more than one, each pinned to its own core with one thread."""

    def __init__(self, jobs: int, cache_dir: Path):
        self.jobs = jobs
        self.cache_dir = cache_dir
        self.cores: queue.Queue[int] = queue.Queue()
        for core in sorted(os.sched_getaffinity(0))[:jobs]:
            self.cores.put(core)

    def run(self, command: list[str], label: str, log: Path) -> None:
        core = self.cores.get()
        try:
            env = {**os.environ, "OPENKBP_CACHE_DIR": str(self.cache_dir)}
            if self.jobs > 1:
                command = ["taskset", "-c", str(core), *command]
                env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
            start = time.perf_counter()
            print(f"{label}: {' '.join(command)}", file=sys.stderr, flush=True)
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "ab") as output:
                subprocess.run(command, check=True, stdout=output, stderr=output, env=env)
            print(f"  {label} done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        finally:
            self.cores.put(core)


def train_command(results: Path, data: Path, name: str, epochs: int, score_every: int, common: list[str],
                  flags: list[str]) -> list[str]:
    """The run's command; a run whose folder has a config already resumes, without --init-from."""
    resuming = (results / name / "models" / "config.json").is_file()
    if resuming:
        dropped, skip = [], False
        for flag in flags:
            if skip:
                skip = False
            elif flag in ("--init-from", "--init-epoch"):
                skip = True
            else:
                dropped.append(flag)
        flags = dropped
    return [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(data), "--results-dir", str(results),
            "--model-name", name, "--epochs", str(epochs), "--score-every", str(score_every), *common, *flags]


@click.command()
@click.option("--data-dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="make-data-dir.sh's folder: 55 training, 30 validation patients.")
@click.option("--work", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Where the data folders (symlinks), the cache and the runs go.")
@click.option("--parent-patients", type=int, default=35, show_default=True)
@click.option("--clinics", default="10,20", show_default=True, help="Comma list of clinic sizes (the others').")
@click.option("--seeds", default="0,1", show_default=True)
@click.option("--deal-seed", type=int, default=0, show_default=True, help="Seed of the patients' dealing.")
@click.option("--filters", type=int, default=8, show_default=True)
@click.option("--resolution", default="64", show_default=True)
@click.option("--batch-size", type=int, default=2, show_default=True)
@click.option("--parent-epochs", type=int, default=120, show_default=True)
@click.option("--updates", type=int, default=1200, show_default=True, help="Updates of every clinic run.")
@click.option("--score-updates", type=int, default=50, show_default=True, help="Score every this many updates.")
@click.option("--freeze-updates", type=int, default=100, show_default=True,
              help="The freezing arm's --freeze-epochs, in updates.")
@click.option("--arms", default=",".join(ARMS), show_default=True)
@click.option("--jobs", type=int, default=1, show_default=True, help="Runs trained at once (one core each).")
@click.option("--cross-site", type=int, default=0, show_default=True,
              help="Also this many prostate phantoms, from scratch and from the parent (0: not).")
@click.option("--cross-site-epochs", type=int, default=5, show_default=True)
def main(data_dir, work, parent_patients, clinics, seeds, deal_seed, filters, resolution, batch_size, parent_epochs,
         updates, score_updates, freeze_updates, arms, jobs, cross_site, cross_site_epochs):
    clinics = [int(size) for size in clinics.split(",")]
    seeds = [int(seed) for seed in seeds.split(",")]
    arms = [arm.strip() for arm in arms.split(",")]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown or SCRATCH not in arms:
        raise click.BadParameter(f"Expected arms of {list(ARMS)}, scratch among them. Received: {arms}")
    parents, others = deal(data_dir, parent_patients, deal_seed)
    if max(clinics) > len(others):
        raise click.BadParameter(f"Expected clinics of at most {len(others)} patients (the {len(others)} not the "
                                 f"parent's). Received: {clinics}")
    validation = validation_farm(work / "data" / "validation-pats", data_dir)
    folders = {"parent": symlink_farm(work / "data" / "parent", data_dir, parents, validation)}
    for size in clinics:
        folders[size] = symlink_farm(work / "data" / f"clinic-{size}", data_dir, others[:size], validation)
    results, logs = work / "results", work / "logs"
    lanes = Lanes(jobs, work / "cache")
    common = ["--filters", str(filters), "--resolution", resolution, "--batch-size", str(batch_size),
              "--save-every", "10", "--keep", "1"]

    # 1. the parent (its best.keras is what the arms start from)
    parent_dir = results / "parent"
    parent_updates = math.ceil(len(parents) / batch_size)
    if not finished(parent_dir, parent_epochs):
        lanes.run(train_command(results, folders["parent"], "parent", parent_epochs, 10, common,
                                ["--preset", "v2"]), "parent", logs / "parent.log")

    # 2. the clinics' arms: one queue, arm after arm within each clinic and seed
    todo, plan = [], {}
    for size in clinics:
        per_epoch = math.ceil(size / batch_size)
        epochs = updates // per_epoch
        score_every = max(1, score_updates // per_epoch)
        freeze = max(1, freeze_updates // per_epoch)
        for seed in seeds:
            for arm in arms:
                name = f"clinic{size}-{arm}-seed{seed}"
                plan[name] = {"clinic": size, "seed": seed, "arm": arm, "epochs": epochs, "per_epoch": per_epoch}
                flags = [flag.format(parent=parent_dir, freeze=freeze) for flag in ARMS[arm]] + ["--seed", str(seed)]
                if not finished(results / name, epochs):
                    todo.append((train_command(results, folders[size], name, epochs, score_every, common, flags),
                                 name))
    # 3. the cross-site start: prostate phantoms from scratch and from the OpenKBP parent
    cross = {}
    if cross_site:
        from provided_code.data.phantoms import write_prostate_phantom_split
        from provided_code.sites import load_site

        prostate = work / "data" / "prostate"
        if not (prostate / "train-pats").is_dir():
            write_prostate_phantom_split(prostate / "train-pats", cross_site, site=load_site("prostate"))
            write_prostate_phantom_split(prostate / "validation-pats", 4, first_number=201, site=load_site("prostate"))
        for seed in seeds:
            for arm, flags in (("prostate-scratch", []), ("prostate-tuned", ["--init-from", str(parent_dir)])):
                name = f"{arm}-seed{seed}"
                cross[name] = {"arm": arm, "seed": seed}
                if not finished(results / name, cross_site_epochs):
                    todo.append((train_command(results, prostate, name, cross_site_epochs, 1, common,
                                               ["--site", "prostate", "--preset", "v2", "--seed", str(seed),
                                                *flags]), name))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(lanes.run, command, label, logs / f"{label}.log") for command, label in todo]:
            future.result()

    runs = {name: {**info, **run_record(results / name, info["per_epoch"])} for name, info in plan.items()}
    parent = run_record(parent_dir, parent_updates)
    table = {}
    for size in clinics:
        for arm in arms:
            mine = [runs[name] for name, info in plan.items() if info["clinic"] == size and info["arm"] == arm]
            reach = []
            for run in mine:
                scratch = runs[f"clinic{size}-{SCRATCH}-seed{run['seed']}"]
                reach.append(epochs_to_reach(run["curve"], scratch["best_dose_score"]))
            table[f"clinic{size}-{arm}"] = {
                "clinic": size, "arm": arm, "flags": ARMS[arm],
                **{key: summarise([run[key] for run in mine]) for key in
                   ("best_dose_score", "best_dvh_score", "last_dose_score", "last_dvh_score", "best_epoch")},
                "epochs_to_scratch_best": reach, "epochs": mine[0]["epochs"], "updates_per_epoch": mine[0]["per_epoch"],
                "updates_to_scratch_best": [None if epoch is None else epoch * mine[0]["per_epoch"] for epoch in reach]}
    cross_runs = {name: {**info, **run_record(results / name, math.ceil(cross_site / batch_size))}
                  for name, info in cross.items()}

    print("| clinic | arm | best dose score | its DVH score | last dose score | last DVH score | epoch of the best | "
          "epochs to reach scratch's best (seeds) |\n|---|---|---|---|---|---|---|---|", file=sys.stderr)
    print(f"| 0 | the parent as it is ({len(parents)} other patients) | {parent['best_dose_score']:.2f} | "
          f"{parent['best_dvh_score']:.2f} | {parent['last_dose_score']:.2f} | {parent['last_dvh_score']:.2f} | "
          f"{parent['best_epoch']} | |", file=sys.stderr)
    for row in table.values():
        def cell(key, digits=2):
            return f"{row[key]['mean']:.{digits}f} ± {row[key]['sd']:.{digits}f}"
        reach = ", ".join("never" if epoch is None else str(epoch) for epoch in row["epochs_to_scratch_best"])
        print(f"| {row['clinic']} | {row['arm']} | {cell('best_dose_score')} | {cell('best_dvh_score')} | "
              f"{cell('last_dose_score')} | {cell('last_dvh_score')} | {cell('best_epoch', 0)} | {reach} |",
              file=sys.stderr)
    print(f"parent ({len(parents)} patients, {parent_epochs} epochs): best dose score {parent['best_dose_score']:.2f} "
          f"(DVH {parent['best_dvh_score']:.2f}) at epoch {parent['best_epoch']}", file=sys.stderr)
    for name, run in cross_runs.items():
        print(f"{name}: first-epoch loss {run['first_epoch_loss']:.3f}", file=sys.stderr)
    print(json.dumps({"settings": {"data_dir": str(data_dir), "filters": filters, "resolution": int(resolution),
                                   "batch_size": batch_size, "seeds": seeds, "updates": updates,
                                   "score_updates": score_updates, "freeze_updates": freeze_updates,
                                   "parent_epochs": parent_epochs, "jobs": jobs, "deal_seed": deal_seed},
                      "patients": {"parent": parents, "others": others,
                                   **{f"clinic{size}": others[:size] for size in clinics}},
                      "parent": parent, "table": table, "runs": runs, "cross_site": cross_runs}, indent=2))


if __name__ == "__main__":
    main()
