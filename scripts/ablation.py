#!/usr/bin/env python
"""The training-recipe comparison behind the defaults (README, "Training recipe"): prints JSON.

Trains the starter recipe and each addition (masked loss; + flips; + rotations and shifts;
+ cosine schedule) with the CLI, the same settings and epochs for each, over several seeds, and
reads each run's validation scores from its ``training_log.csv`` (written by the same code as
``openkbp-score``). Runs already finished are read, not retrained, so an interrupted comparison
continues where it stopped.

    bash ../shared/openkbp-more/make-data-dir.sh /tmp/openkbp-55
    python scripts/ablation.py --data-dir /tmp/openkbp-55 --results-dir /tmp/ablation > ablation.json
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
RECIPES = {  # name -> the recipe's flags; each row adds one thing to the one above
    "starter": ["--loss", "mae", "--augment", "none", "--lr-schedule", "constant"],
    "masked": ["--loss", "masked-mae", "--augment", "none", "--lr-schedule", "constant"],
    "flip": ["--loss", "masked-mae", "--augment", "flip", "--lr-schedule", "constant"],
    "rotate-shift": ["--loss", "masked-mae", "--augment", "flip,rotate,shift", "--lr-schedule", "constant"],
    "cosine": ["--loss", "masked-mae", "--augment", "flip,rotate,shift", "--lr-schedule", "cosine"],
    # not in the chain: cosine on the best row above, to tell the schedule's effect from the rotations'
    "flip-cosine": ["--loss", "masked-mae", "--augment", "flip", "--lr-schedule", "cosine"],
}


def run_name(recipe: str, seed: int) -> str:
    return f"{recipe}-seed{seed}"


def read_scores(log_path: Path) -> dict:
    with open(log_path, newline="") as handle:
        every = list(csv.DictReader(handle))
    rows = [row for row in every if row["val_dose_score"]]
    best = min(rows, key=lambda row: float(row["val_dose_score"]))
    return {"last_epoch": int(rows[-1]["epoch"]), "last_dose_score": float(rows[-1]["val_dose_score"]),
            "last_dvh_score": float(rows[-1]["val_dvh_score"]), "best_epoch": int(best["epoch"]),
            "best_dose_score": float(best["val_dose_score"]), "best_dvh_score": float(best["val_dvh_score"]),
            "seconds": sum(float(row["epoch_seconds"]) for row in every)}


def summarise(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


@click.command()
@click.option("--data-dir", required=True, help="55 training patients and the sample's 6 validation patients.")
@click.option("--results-dir", required=True, help="Where the runs go (results/<run>/).")
@click.option("--seeds", default="0,1", help="Comma list of seeds.")
@click.option("--epochs", type=int, default=30)
@click.option("--resolution", default="64")
@click.option("--filters", type=int, default=8)
@click.option("--score-every", type=int, default=5)
@click.option("--recipes", default=",".join(RECIPES), help="Comma list of recipe names (default: all).")
def main(data_dir, results_dir, seeds, epochs, resolution, filters, score_every, recipes):
    seeds = [int(seed) for seed in seeds.split(",")]
    chosen = [name.strip() for name in recipes.split(",")]
    unknown = [name for name in chosen if name not in RECIPES]
    if unknown:
        raise click.BadParameter(f"unknown recipe(s) {unknown}; expected names from {list(RECIPES)}")
    common = ["--data-dir", data_dir, "--results-dir", results_dir, "--epochs", str(epochs), "--resolution",
              resolution, "--filters", str(filters), "--score-every", str(score_every), "--save-every", "5"]
    runs = {}
    for recipe in chosen:
        for seed in seeds:
            name = run_name(recipe, seed)
            command = [sys.executable, str(REPO / "runpod_train.py"), *common, *RECIPES[recipe],
                       "--seed", str(seed), "--model-name", name]
            start = time.perf_counter()
            print(f"{recipe}, seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
            runs[name] = {"recipe": recipe, "seed": seed, "flags": RECIPES[recipe],
                          **read_scores(Path(results_dir) / name / "training_log.csv")}
            print(f"  {runs[name]} ({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
    table = {}
    for recipe in chosen:
        mine = [run for run in runs.values() if run["recipe"] == recipe]
        table[recipe] = {key: summarise([run[key] for run in mine])
                         for key in ("last_dose_score", "last_dvh_score", "best_dose_score", "best_dvh_score")}
    print("| recipe | flags | dose score, last epoch | DVH score, last epoch | best dose score (its DVH) |\n|---|---|---|---|---|",
          file=sys.stderr)
    for recipe, row in table.items():
        def cell(key):
            return f"{row[key]['mean']:.2f} ± {row[key]['sd']:.2f}"
        print(f"| {recipe} | `{' '.join(RECIPES[recipe])}` | {cell('last_dose_score')} | {cell('last_dvh_score')} | "
              f"{cell('best_dose_score')} ({cell('best_dvh_score')}) |", file=sys.stderr)
    print(json.dumps({"settings": {"epochs": epochs, "resolution": int(resolution), "filters": filters,
                                   "seeds": seeds, "score_every": score_every, "data_dir": data_dir},
                      "table": table, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
