#!/usr/bin/env python
"""The comparisons behind the defaults (docs/recipe.md): prints JSON and a Markdown table.

Trains each row's recipe with the CLI (``runpod_train.py``), the same settings and epochs for
each, over several seeds, and reads each run's validation scores from its ``training_log.csv``
(written by the same code as ``openkbp-score``). Runs already finished are read, not retrained,
so an interrupted comparison continues where it stopped; a run that stopped part-way resumes
from its last checkpoint. With ``--jobs 2`` two runs train at once, each pinned to its own core
with one TensorFlow thread (on a 2-core machine about 1.4 times the throughput of one run on
both cores). ``--ensemble ROW`` also averages that row's seeds (``--predict-only --ensemble``)
and scores the average.

Five tables: ``--table recipe`` (the 30-epoch recipe chain, each row adding one thing to the row
above), ``--table network`` (the longer comparison: every row is ``--preset v1`` plus one change,
``combined`` the changes the single rows supported, ``--preset v2``, and the rows after it
``combined`` plus one change), ``--table body`` (the residual U-Net against the generator of
``--preset v2``, each with and without ``--physics``; ``--filters 8`` and ``16``), ``--table width`` (the
body's stage widths, its plain control and its head by quality per compute) and ``--table head`` (the
dose heads on the default body; with ``--phantoms`` on phantoms written into ``--data-dir``, as the
learns test trains them: docs/recipe.md).

    bash ../shared/openkbp-more/make-data-dir.sh /tmp/openkbp-55
    python scripts/ablation.py --table network --data-dir /tmp/openkbp-55 --results-dir /tmp/ablation-network \\
        --epochs 120 --score-every 10 --jobs 2 --first-seed-only beams-each --ensemble combined > network.json
"""

from __future__ import annotations

import csv
import json
import os
import queue
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
TABLES = {
    # name -> the row's flags; each row adds one thing to the one above
    "recipe": {name: ["--preset", "v1", *flags] for name, flags in {  # v1's network: batch norm, CT and masks
        "starter": ["--loss", "mae", "--augment", "none", "--lr-schedule", "constant"],
        "masked": ["--loss", "masked-mae", "--augment", "none", "--lr-schedule", "constant"],
        "flip": ["--loss", "masked-mae", "--augment", "flip", "--lr-schedule", "constant"],
        "rotate-shift": ["--loss", "masked-mae", "--augment", "flip,rotate,shift", "--lr-schedule", "constant"],
        "cosine": ["--loss", "masked-mae", "--augment", "flip,rotate,shift", "--lr-schedule", "cosine"],
        # not in the chain: cosine on the best row above, to tell the schedule's effect from the rotations'
        "flip-cosine": ["--loss", "masked-mae", "--augment", "flip", "--lr-schedule", "cosine"],
    }.items()},
    # name -> v1 plus one change (combined: the changes the rows above supported)
    "network": {
        "v1": ["--preset", "v1"],
        "prescription": ["--preset", "v1", "--prescription-channel"],
        "beams": ["--preset", "v1", "--beams", "9"],
        "beams-each": ["--preset", "v1", "--beams", "9", "--beam-channels", "each"],
        "instance": ["--preset", "v1", "--norm", "instance"],
        "dvh": ["--preset", "v1", "--dvh-weight", "0.2"],
        "rotate-shift": ["--preset", "v1", "--augment", "flip,rotate,shift"],
        "cosine": ["--preset", "v1", "--lr-schedule", "cosine"],
        "ema": ["--preset", "v1", "--ema"],
        "combined": ["--preset", "v2"],  # the defaults it chose (until the body's comparison)
        "combined-ema": ["--preset", "v2", "--ema"],
        # the DVH weight measured on the steadier combined (its seeds end 0.06 Gy apart, v1's 0.4)
        "combined-dvh-0.2": ["--preset", "v2", "--dvh-weight", "0.2"],
        "combined-dvh-1": ["--preset", "v2", "--dvh-weight", "1"],
    },
    # issue 40's: the network's body (and its inputs) against --preset v2, the generator
    "body": {
        "v2": ["--preset", "v2"],
        "resunet": ["--preset", "v2", "--arch", "resunet", "--dropout", "0", "--learning-rate", "1e-3"],
        "v2-physics": ["--preset", "v2", "--physics"],
        "resunet-physics": ["--preset", "v2", "--arch", "resunet", "--dropout", "0", "--learning-rate", "1e-3",
                            "--physics"],
    },
    # issue 52's: the body's widths by quality per compute (--preset default is the residual U-Net with the
    # softplus head; the first rows change its widths or its residual additions, the last ones the schedule and
    # augmentation of a body: WIDTH_VARIANTS)
    "width": {
        "v2": ["--preset", "v2"],
        **{name: ["--preset", "default", "--arch", arch, "--widths", widths] for name, (arch, widths) in {
            "resunet": ("resunet", "1,2,4,8,8,8"),
            "resunet-f4": ("resunet", "0.5,1,2,4,4,4"),  # = --filters 4
            # the same widths, named for a table at other filters (at 16 the layers of "resunet" at 8; at the
            # card's 64 filters nnU-Net's residual encoder's 32 features at full resolution and a cap of 256)
            "half": ("resunet", "0.5,1,2,4,4,4"),
            "thin": ("resunet", "0.25,1,2,4,8,8"),
            "thin-capped": ("resunet", "0.25,0.5,1,2,4,4"),
            "half-capped": ("resunet", "0.5,0.5,1,2,4,4"),
            "plain-half-capped": ("plain", "0.5,0.5,1,2,4,4"),
            "plain-thin": ("plain", "0.25,1,2,4,8,8"),
        }.items()},
    },
}
# The schedule and augmentation arms of a width row: 60 epochs against the table's, and rotations (and
# shifts) besides the flips
WIDTH_VARIANTS = {"60": ["--epochs", "60"], "rotate": ["--augment", "flip,rotate"],
                  "rotate-shift": ["--augment", "flip,rotate,shift"]}
TABLES["width"].update({f"{body}-{variant}": [*TABLES["width"][body], *flags]
                        for body in ("thin", "half") for variant, flags in WIDTH_VARIANTS.items()})
# The head arms: the ReLU head's fit with a gradient below zero while training, on the half body and on the
# best body within the card's budget
TABLES["width"].update({f"{body}-{head}": [*TABLES["width"][body], "--head", head]
                        for body in ("half", "half-capped") for head in ("leaky", "relu")})
# The dose heads on the default body, for short runs on phantoms (--phantoms): does each learn them at all?
TABLES["head"] = {head: ["--preset", "default", "--head", head] for head in ("softplus", "leaky", "relu")}


def run_name(row: str, seed: int) -> str:
    return f"{row}-seed{seed}"


def read_scores(log_path: Path, tail: int) -> dict:
    """The last and best scores of a run, and the mean of its last ``tail`` scorings (less noisy
    than the last alone; where the curve has flattened, close to the best); its last epoch's
    training loss and its median seconds an epoch (robust to an epoch slowed by a pause)."""
    with open(log_path, newline="") as handle:
        every = list(csv.DictReader(handle))
    rows = [row for row in every if row["val_dose_score"]]
    best = min(rows, key=lambda row: float(row["val_dose_score"]))
    return {"last_epoch": int(rows[-1]["epoch"]), "last_dose_score": float(rows[-1]["val_dose_score"]),
            "last_dvh_score": float(rows[-1]["val_dvh_score"]),
            "tail_dose_score": statistics.fmean(float(row["val_dose_score"]) for row in rows[-tail:]),
            "tail_dvh_score": statistics.fmean(float(row["val_dvh_score"]) for row in rows[-tail:]),
            "best_epoch": int(best["epoch"]), "best_dose_score": float(best["val_dose_score"]),
            "best_dvh_score": float(best["val_dvh_score"]),
            "curve": [[int(row["epoch"]), round(float(row["val_dose_score"]), 3)] for row in rows],
            "final_loss": float(every[-1]["loss"]),
            "median_epoch_seconds": statistics.median(float(row["epoch_seconds"]) for row in every),
            "seconds": sum(float(row["epoch_seconds"]) for row in every)}


def row_epochs(flags: list[str], epochs: int) -> int:
    """The epochs a row trains: its own ``--epochs`` where it gives one (a shorter schedule), else the table's."""
    return int(flags[flags.index("--epochs") + 1]) if "--epochs" in flags else epochs


def finished(log_path: Path, epochs: int) -> bool:
    if not log_path.is_file():
        return False
    with open(log_path, newline="") as handle:
        epochs_logged = [int(row["epoch"]) for row in csv.DictReader(handle)]
    return bool(epochs_logged) and max(epochs_logged) >= epochs


def summarise(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


class Lanes:
    """``jobs`` runs at once; with more than one, each is pinned to its own core with one thread."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.cores: queue.Queue[int] = queue.Queue()
        for core in sorted(os.sched_getaffinity(0))[:jobs]:
            self.cores.put(core)

    def run(self, command: list[str], label: str) -> None:
        core = self.cores.get()
        try:
            env = dict(os.environ)
            if self.jobs > 1:
                command = ["taskset", "-c", str(core), *command]
                env.update(TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
            start = time.perf_counter()
            print(f"{label}: {' '.join(command)}", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
            print(f"  {label} done ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        finally:
            self.cores.put(core)


def write_phantoms(data_dir: Path, count: int, site_name: str) -> None:
    """``count`` training phantoms and ``max(1, count // 2)`` validation phantoms of the site, where
    missing, numbered as the demo's and the tests' (their doses follow their beams)."""
    from provided_code.data.phantoms import missing_numbered_phantoms, write_numbered_phantom
    from provided_code.sites import load_site

    site = load_site(site_name)
    for folders in missing_numbered_phantoms(data_dir, count, max(1, count // 2)).values():
        for folder in folders:
            write_numbered_phantom(folder, site)


@click.command()
@click.option("--table", type=click.Choice(sorted(TABLES)), default="network", show_default=True)
@click.option("--data-dir", required=True, help="make-data-dir.sh's folder: 55 training, 30 validation patients.")
@click.option("--results-dir", required=True, help="Where the runs go (<results-dir>/<row>-seed<N>/).")
@click.option("--seeds", default="0,1", show_default=True, help="Comma list of seeds.")
@click.option("--epochs", type=int, default=30, show_default=True)
@click.option("--resolution", default="64", show_default=True)
@click.option("--filters", type=int, default=8, show_default=True)
@click.option("--score-every", type=int, default=5, show_default=True)
@click.option("--tail", type=int, default=4, show_default=True, help="Scorings averaged for the 'tail' columns.")
@click.option("--rows", default=None, help="Comma list of row names (default: all of the table's).")
@click.option("--jobs", type=int, default=1, show_default=True, help="Runs trained at once (one core each).")
@click.option("--ensemble", "ensemble_rows", default="", help="Comma list of rows whose seeds are also ensembled.")
@click.option("--first-seed-only", default="", help="Comma list of rows trained with the first seed only.")
@click.option("--flags", "common_flags", default="", help="Training flags every row adds, e.g. \"--site prostate "
              "--batch-size 1 --learning-rate 3e-3\".")
@click.option("--phantoms", type=int, default=0, show_default=True,
              help="Write this many training phantoms of the --flags' --site (and half as many, at least one, "
                   "validation phantoms) into --data-dir first, where missing (numbered as the tests' phantoms).")
def main(table, data_dir, results_dir, seeds, epochs, resolution, filters, score_every, tail, rows, jobs,
         ensemble_rows, first_seed_only, common_flags, phantoms):
    recipes = TABLES[table]
    extra = shlex.split(common_flags)
    if phantoms:
        write_phantoms(Path(data_dir), phantoms, extra[extra.index("--site") + 1] if "--site" in extra else "openkbp")
    seeds = [int(seed) for seed in seeds.split(",")]
    single = {name.strip() for name in first_seed_only.split(",") if name.strip()}

    def seeds_of(row):
        return seeds[:1] if row in single else seeds

    chosen = [name.strip() for name in (rows or ",".join(recipes)).split(",")]
    ensembled = [name.strip() for name in ensemble_rows.split(",") if name.strip()]
    unknown = [name for name in chosen + ensembled if name not in recipes]
    if unknown:
        raise click.BadParameter(f"unknown row(s) {unknown}; expected names from {list(recipes)}")
    common = ["--data-dir", data_dir, "--results-dir", results_dir, "--epochs", str(epochs), "--resolution",
              resolution, "--filters", str(filters), "--score-every", str(score_every), "--save-every", "5", *extra]
    lanes = Lanes(jobs)
    todo = []
    for row in chosen:
        for seed in seeds_of(row):
            name = run_name(row, seed)
            if not finished(Path(results_dir) / name / "training_log.csv", row_epochs(recipes[row], epochs)):
                todo.append(([sys.executable, str(REPO / "runpod_train.py"), *common, *recipes[row],
                              "--seed", str(seed), "--model-name", name], name))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(lanes.run, command, label) for command, label in todo]:
            future.result()
    runs = {run_name(row, seed): {"row": row, "seed": seed, "flags": recipes[row],
                                  **read_scores(Path(results_dir) / run_name(row, seed) / "training_log.csv", tail)}
            for row in chosen for seed in seeds_of(row)}
    keys = ("last_dose_score", "last_dvh_score", "tail_dose_score", "tail_dvh_score", "best_dose_score",
            "best_dvh_score")
    summary = {}
    for row in chosen:
        mine = [run for run in runs.values() if run["row"] == row]
        summary[row] = {key: summarise([run[key] for run in mine]) for key in keys}
    ensembles = {}
    for row in ensembled:
        name = f"{row}-ensemble"
        scores_path = Path(results_dir) / name / "validation-predictions" / "scores.json"
        if not scores_path.is_file():
            members = ",".join(run_name(row, seed) for seed in seeds)
            lanes.run([sys.executable, str(REPO / "runpod_train.py"), "--data-dir", data_dir, "--results-dir",
                       results_dir, "--model-name", name, "--predict-only", "--ensemble", members], name)
        ensembles[row] = json.loads(scores_path.read_text())

    print(f"| row | flags | dose score, epoch {epochs} | DVH score, epoch {epochs} | mean of last {tail} scorings: "
          f"dose (DVH) | best dose score (its DVH score) |\n|---|---|---|---|---|---|", file=sys.stderr)
    for row, cells in summary.items():
        def cell(key):
            return f"{cells[key]['mean']:.2f} ± {cells[key]['sd']:.2f}"
        label = f"{row} (seed {seeds[0]} only)" if row in single else row
        print(f"| {label} | `{' '.join(recipes[row])}` | {cell('last_dose_score')} | {cell('last_dvh_score')} | "
              f"{cell('tail_dose_score')} ({cell('tail_dvh_score')}) | {cell('best_dose_score')} "
              f"({cell('best_dvh_score')}) |", file=sys.stderr)
    for row, scores in ensembles.items():
        print(f"| {row}, ensemble of seeds {','.join(map(str, seeds))} (best.keras each) | `--predict-only "
              f"--ensemble` | | | | {scores['dose_score']:.2f} ({scores['dvh_score']:.2f}) |", file=sys.stderr)
    print(f"\n| row | seed | best dose score (its DVH score), epoch | last epoch: dose / DVH score | final training "
          f"loss | seconds per epoch (median) |\n|---|---|---|---|---|---|", file=sys.stderr)
    for run in runs.values():
        print(f"| {run['row']} | {run['seed']} | {run['best_dose_score']:.2f} ({run['best_dvh_score']:.2f}), "
              f"{run['best_epoch']} | {run['last_dose_score']:.2f} / {run['last_dvh_score']:.2f} Gy | "
              f"{run['final_loss']:.2f} Gy | {run['median_epoch_seconds']:.0f} s |", file=sys.stderr)
    print(json.dumps({"settings": {"table": table, "epochs": epochs, "resolution": int(resolution),
                                   "filters": filters, "seeds": seeds, "score_every": score_every, "tail": tail,
                                   "data_dir": data_dir, "jobs": jobs, "flags": extra},
                      "table": summary, "ensembles": ensembles, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
