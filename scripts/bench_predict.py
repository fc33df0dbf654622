#!/usr/bin/env python
"""One patient's prediction on a clinic's CPU server, body against body: prints one JSON object.

    python scripts/bench_predict.py [--resolution 128] [--filters 64] [--folds 5] [--repeats 3] \\
        [--arms default,v2]

For each arm (``default``: ``TrainConfig``'s network; ``v2``: ``--preset v2``'s generator;
``resunet-full``: the residual U-Net at the widths it had before the comparison of issue 52,
1,2,4,8,8,8; ``thin``/``thin-capped``/``half-capped``/``half``: its widths 0.25,1,2,4,8,8 / 0.25,0.5,1,2,4,4 /
0.5,0.5,1,2,4,4 / 0.5,1,2,4,4,4, the last ``--filters 32`` of the old widths), ``--folds``
models of that network with weights of their own (random: the time does not depend on what they
learned) are saved as run folders, then opened and loaded together as the deployed model a node
keeps in memory (:class:`provided_code.deployed_model.DeployedModel`, the code of
``openkbp-dicom predict`` and the node), and one phantom patient at 128³ is predicted:

- ``per_fold_s``: one member's :meth:`DeployedModel.predict` (its forward pass at the model's
  resolution, brought back to 128³ and masked);
- ``deployed_s`` / ``deployed_tta_s``: the whole deployed model, every fold, without and with
  ``--tta`` (each fold twice: the patient and its mirror);
- ``load_s``: loading the folds' checkpoints (once per command for ``openkbp-dicom predict``,
  once per start for the node).

Each a median of ``--repeats``, the arms alternating in one process (after a warm-up prediction
of every fold), with TensorFlow's default threads (every core): what a server that predicts one patient at a
time does. ``ratio_to_v2`` divides each arm's figures by the generator's. The machine is named
(processor, cores, the AVX flags) beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ARMS = {"default": {}, "v2": "v2", "resunet-full": {"arch": "resunet", "widths": "1,2,4,8,8,8"},
        "thin": {"arch": "resunet", "widths": "0.25,1,2,4,8,8"},
        "thin-capped": {"arch": "resunet", "widths": "0.25,0.5,1,2,4,4"},
        "half-capped": {"arch": "resunet", "widths": "0.5,0.5,1,2,4,4"},
        "half": {"arch": "resunet", "widths": "0.5,1,2,4,4,4"}}


def machine() -> dict:
    flags = set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    name = platform.processor()
    try:
        with open("/proc/cpuinfo") as handle:
            name = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), name)
    except OSError:
        pass
    return {"processor": name, "cores": len(os.sched_getaffinity(0)),
            "avx": sorted(flag for flag in flags if flag.startswith(("avx", "fma", "amx")))}


def arm_config(arm: str, resolution: int, filters: int, fold: int, root: Path):
    from provided_code.config import TrainConfig
    from provided_code.presets import PRESETS

    recipe = ARMS[arm]
    fields = dict(PRESETS[recipe]) if isinstance(recipe, str) else dict(recipe)
    return TrainConfig(**fields, resolution=resolution, filters=filters, seed=fold, results_dir=str(root),
                       model_name=f"{arm}-{fold}", epochs=1)


def save_folds(arm: str, resolution: int, filters: int, folds: int, root: Path) -> list:
    """``folds`` run folders of ``arm``'s network, each with a checkpoint of weights of its own."""
    import keras

    from provided_code.run_folder import RunFolder
    from provided_code.training.model import new_model

    folders = []
    for fold in range(1, folds + 1):
        config = arm_config(arm, resolution, filters, fold, root)
        keras.utils.set_random_seed(fold)
        model = new_model(config.spec, config.learning_rate)
        folder = RunFolder(config.run_dir)
        folder.models.mkdir(parents=True)
        folder.write_config(config)
        model.save(folder.checkpoint(1))
        folders.append(folder)
        keras.backend.clear_session()
    return folders


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--filters", type=int, default=64)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", default="default,v2")
    args = parser.parse_args()
    arms = [arm.strip() for arm in args.arms.split(",")]
    unknown = [arm for arm in arms if arm not in ARMS]
    if unknown:
        parser.error(f"Invalid `arms`. Expected names from {sorted(ARMS)}. Received: {unknown}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from provided_code.infra.environment import configure_tensorflow

    configure_tensorflow()
    from provided_code.data.cache import load_split
    from provided_code.data.phantoms import write_phantom_split
    from provided_code.deployed_model import DeployedModel
    from provided_code.sites import openkbp
    from provided_code.networks.cost import forward_macs

    root = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    try:
        write_phantom_split(root / "data" / "test-pats", 1)
        patient = load_split(root / "data" / "test-pats", cache_dir=root / "cache", require_dose=False, workers=1,
                             site=openkbp())
        deployed, figures = {}, {}
        for arm in arms:
            folders = save_folds(arm, args.resolution, args.filters, args.folds, root / "models")
            opened = DeployedModel.of_runs(arm, folders, [None] * len(folders))
            start = time.perf_counter()
            deployed[arm] = opened.loaded()
            trained = deployed[arm].models[0]
            figures[arm] = {"widths": trained.config.widths, "arch": trained.config.arch,
                            "gmac_per_sample": round(forward_macs(trained.model) / 1e9, 3),
                            "load_s": time.perf_counter() - start}
            one = DeployedModel(arm, deployed[arm].members[:1], None, models=deployed[arm].models[:1])
            deployed[arm] = (one, deployed[arm])
            deployed[arm][1].predict(patient, tta=True)  # warm-up: every member's prediction traced
        samples = {arm: {"per_fold_s": [], "deployed_s": [], "deployed_tta_s": []} for arm in arms}
        for _ in range(args.repeats):
            for arm in arms:  # alternating: each arm sees the same conditions
                one, whole = deployed[arm]
                samples[arm]["per_fold_s"].append(timed(lambda: one.predict(patient)))
                samples[arm]["deployed_s"].append(timed(lambda: whole.predict(patient)))
                samples[arm]["deployed_tta_s"].append(timed(lambda: whole.predict(patient, tta=True)))
        for arm in arms:
            figures[arm].update({name: statistics.median(values) for name, values in samples[arm].items()})
            figures[arm]["samples"] = samples[arm]
        if "v2" in figures:
            for arm in arms:
                figures[arm]["ratio_to_v2"] = {name: figures[arm][name] / figures["v2"][name]
                                               for name in ("gmac_per_sample", "per_fold_s", "deployed_s",
                                                            "deployed_tta_s")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"settings": {"resolution": args.resolution, "filters": args.filters, "folds": args.folds,
                                   "repeats": args.repeats, "threads": "TensorFlow's default (every core)"},
                      "machine": machine(), "arms": figures}, indent=2))


if __name__ == "__main__":
    main()
