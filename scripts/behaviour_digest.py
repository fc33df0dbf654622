#!/usr/bin/env python
"""What this checkout trains and predicts, as a digest to hold against another checkout's: a
restructuring must leave it identical (weights, losses, scores, prediction files).

    python scripts/behaviour_digest.py [--workdir W]      # in each checkout, then compare the JSON

Four short deterministic runs on phantoms (4 filters at 32³, 2 epochs, ``--xla off``, one thread):
OpenKBP's ``--preset v1 --augment flip,rotate,shift``, OpenKBP's ``--preset v2`` (the defaults until
the residual U-Net became the default body), the prostate's ``--preset v2`` (with patients of their
own plans: per-patient prescriptions and beams) with ``--augment flip,rotate``, and OpenKBP's
``--preset v2 --beams 5 --beam-channels each --norm batch --no-prescription-channel`` scored every
epoch; then ``--predict-only`` of each (``--epoch best``, or ``--tta``). Prints JSON: each
run's weights fingerprint, its ``--predict-only`` scores, and a SHA-256 (16 hex digits) of every
prediction CSV, ``scores.json`` and the training log's losses and scores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN = ("--filters", "4", "--resolution", "32", "--epochs", "2", "--xla", "off")
RUNS = {  # name: (data, flags)
    "v1": ("openkbp", ("--preset", "v1", "--augment", "flip,rotate,shift")),
    "def": ("openkbp", ("--preset", "v2")),
    "pro": ("prostate", ("--preset", "v2", "--site", "prostate", "--augment", "flip,rotate")),
    "pro2": ("openkbp", ("--preset", "v2", "--beams", "5", "--beam-channels", "each", "--norm", "batch", "--no-prescription-channel",
                         "--score-every", "1")),
}
PREDICT = {"v1": ("--tta",), "def": ("--epoch", "best"), "pro": ("--tta",), "pro2": ("--epoch", "best")}


def write_data(work: Path) -> dict[str, Path]:
    """The phantoms (the same seeds in every checkout): OpenKBP's 4 + 2, the prostate's 4 + 2 (every
    second with a plan of its own)."""
    code = (f"from provided_code.data.phantoms import write_phantom_split, write_prostate_phantom_split\n"
            f"from provided_code.sites import load_site\n"
            f"write_phantom_split({str(work / 'openkbp' / 'train-pats')!r}, 4, seed=0)\n"
            f"write_phantom_split({str(work / 'openkbp' / 'validation-pats')!r}, 2, first_number=5, seed=0)\n"
            f"kw = dict(seed=0, own_plan_every=2, site=load_site('prostate'))\n"
            f"write_prostate_phantom_split({str(work / 'prostate' / 'train-pats')!r}, 4, **kw)\n"
            f"write_prostate_phantom_split({str(work / 'prostate' / 'validation-pats')!r}, 2, first_number=5, **kw)\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)
    return {"openkbp": work / "openkbp", "prostate": work / "prostate"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = args.workdir or Path(scratch)
        data = write_data(work)
        env = {**os.environ, "OPENKBP_CACHE_DIR": str(work / "cache"), "TF_NUM_INTRAOP_THREADS": "1",
               "TF_CPP_MIN_LOG_LEVEL": "2"}
        results, out = work / "results", {}
        for name, (which, flags) in RUNS.items():
            base = [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(data[which]), "--results-dir",
                    str(results), "--model-name", name]
            trained = subprocess.run([*base, *RUN, *flags], env=env, capture_output=True, text=True)
            if trained.returncode:
                raise SystemExit(f"{name} failed:\n{trained.stderr[-2000:]}")
            fingerprint = re.search(r"Weights fingerprint ([0-9a-f]+)", trained.stderr).group(1)
            predicted = subprocess.run([*base, "--predict-only", "--stage", "validation", *PREDICT[name]], env=env,
                                       capture_output=True, text=True)
            if predicted.returncode:
                raise SystemExit(f"{name} --predict-only failed:\n{predicted.stderr[-2000:]}")
            folder = results / name
            log = [",".join(line.split(",")[:5]) for line in (folder / "training_log.csv").read_text().splitlines()]
            out[name] = {"fingerprint": fingerprint, "scores": next(line for line in predicted.stdout.splitlines()
                                                                 if line.startswith("dose score")),
                         "log": hashlib.sha256("\n".join(log).encode()).hexdigest()[:16],
                         "files": {str(path.relative_to(folder)): digest(path) for path in sorted(
                             folder.glob("validation-predictions/*")) if path.suffix in (".csv", ".json")}}
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
