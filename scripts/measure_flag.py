#!/usr/bin/env python
"""Measure the in-distribution check (provided_code/metrics/anatomy.py) on a data folder, without
a trained model: the check reads the patients' CT and structures only (issue 41, item 3).

    python scripts/measure_flag.py DATA_DIR [--alpha 0.05] [--phantoms 20]

Prints JSON:

- ``training_left_out``: each training patient checked against a cohort fitted on the others
  (its own leave-one-out scores recomputed without it): how many are flagged, against the
  binomial 95 % range of n patients each flagged with probability alpha;
- ``validation``: the validation patients against the cohort of all training patients, likewise;
- ``altered``: the validation patients altered in memory (``scripts/alter_anatomy.py``'s functions):
  PTV70 grown by 15 and by 20 mm, an organ moved 20 mm towards PTV70 (the one that move puts furthest
  into the targets; and the brainstem alone), the brainstem moved onto PTV70's centre (as
  ``alter_anatomy.py`` writes it), a parotid deleted, the CT +300 HU inside the body; and ``phantoms``: the demo's synthetic head-and-neck phantoms. Each
  with the share flagged and, per patient, its p-value, the feature that adds most to its score
  and its first reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provided_code.data.csv_io import read_patient  # noqa: E402
from provided_code.data.phantoms import make_phantom  # noqa: E402
from provided_code.data_folder import split_dir  # noqa: E402
from provided_code.folds import natural_key  # noqa: E402
from provided_code.metrics import anatomy, calibration  # noqa: E402
from provided_code.sites import load_site  # noqa: E402
from scripts.alter_anatomy import (ORGANS, TARGET, deleted_organ, grown_target, moved_into_target,  # noqa: E402
                                   moved_onto_target, shifted_ct)


def _patients(data_dir: Path, split: str, site):
    for folder in sorted(split_dir(data_dir, split).glob("pt_*"), key=lambda p: natural_key(p.name)):
        yield read_patient(folder, require_dose=False, site=site)


def _bits(site, masks: dict, shape) -> np.ndarray:
    packed = np.zeros(shape, site.mask_dtype)
    for k, name in enumerate(site.names):
        if name in masks:
            packed |= masks[name].astype(site.mask_dtype) << k
    return packed


def _summary(found: dict, alpha: float) -> dict:
    flagged = {pid: entry for pid, entry in found.items() if not entry["inside"]}
    return {"patients": len(found), "flagged": len(flagged), "rate": round(len(flagged) / max(len(found), 1), 4),
            "binomial_95_if_exchangeable": list(calibration.binomial_counts(len(found), alpha)),
            "each": {pid: {"p_value": round(entry["p_value"], 4), "feature": entry["feature"],
                           "flagged": not entry["inside"], "reason": (entry["reasons"] or [None])[0]}
                     for pid, entry in found.items()}}


def measure(data_dir: Path, alpha: float, phantoms: int) -> dict:
    site = load_site("openkbp")
    train = {p.patient_id: anatomy.anatomy_features(p.structure_masks, p.possible_dose_mask, p.voxel_dimensions,
                                                    site, p.ct) for p in _patients(data_dir, "train", site)}
    features = pd.DataFrame(train).T
    left_out = {pid: anatomy.check(anatomy.fit_cohort(features.drop(index=pid), alpha), row.to_dict())
                for pid, row in features.iterrows()}
    cohort = anatomy.fit_cohort(features, alpha)
    result = {"data": str(data_dir), "alpha": alpha, "method": cohort["method"], "cohort_patients": len(features),
              "threshold": cohort["threshold"], "training_left_out": _summary(left_out, alpha)}
    validation, altered = {}, {kind: {} for kind in ("target_grown_15mm", "target_grown_20mm", "organ_moved_20mm", "brainstem_moved_20mm",
                                                     "brainstem_onto_target",
                                                     "organ_deleted", "ct_plus_300_hu")}

    def check(masks, body, spacing, ct):
        return anatomy.check(cohort, anatomy.anatomy_features(masks, body, spacing, site, ct))

    for patient in _patients(data_dir, "validation", site):
        pid, ct, spacing = patient.patient_id, patient.ct, patient.voxel_dimensions
        body = patient.possible_dose_mask.astype(bool)
        masks = {name: (patient.structure_masks & site.bit(name)) != 0 for name in site.names}
        validation[pid] = check(patient.structure_masks, body, spacing, ct)
        if masks[TARGET].any():
            targets = np.any([masks[name] for name in site.names if name.startswith("PTV")], axis=0)
            for mm in (15, 20):
                grown = {**masks, TARGET: grown_target(masks[TARGET], body, spacing, mm)}
                altered[f"target_grown_{mm}mm"][pid] = check(_bits(site, grown, body.shape), body, spacing, ct)
            organ, moved = moved_into_target({name: masks[name] for name in ORGANS}, masks[TARGET], targets, body,
                                             spacing)
            found = check(_bits(site, {**masks, organ: moved}, body.shape), body, spacing, ct)
            altered["organ_moved_20mm"][pid] = {**found, "reasons": [f"({organ} moved) "
                                                                     + "; ".join(found["reasons"])]}
            if masks["Brainstem"].any():
                _, moved = moved_into_target({"Brainstem": masks["Brainstem"]}, masks[TARGET], targets, body, spacing)
                found = check(_bits(site, {**masks, "Brainstem": moved}, body.shape), body, spacing, ct)
                inside = float((moved & targets).sum() / max(moved.sum(), 1))
                altered["brainstem_moved_20mm"][pid] = {**found, "reasons": [
                    f"({100 * inside:.0f} % of the moved brainstem inside a target) " + "; ".join(found["reasons"])]}
                moved, _ = moved_onto_target(masks["Brainstem"], masks[TARGET], body)
                altered["brainstem_onto_target"][pid] = check(_bits(site, {**masks, "Brainstem": moved}, body.shape),
                                                              body, spacing, ct)
        lost = deleted_organ(int(pid.split("_")[1]))
        if masks[lost].any():
            kept = {name: mask for name, mask in masks.items() if name != lost}
            altered["organ_deleted"][pid] = check(_bits(site, kept, body.shape), body, spacing, ct)
        altered["ct_plus_300_hu"][pid] = check(patient.structure_masks, body, spacing, shifted_ct(ct, body))
    result["validation"] = _summary(validation, alpha)
    result["altered"] = {kind: _summary(found, alpha) for kind, found in altered.items()}
    made = {}
    for k in range(phantoms):
        volumes = make_phantom(201 + k)
        made[f"phantom_{201 + k}"] = check(_bits(site, volumes, volumes["ct"].shape), volumes["possible_dose_mask"],
                                           volumes["voxel_dimensions"], volumes["ct"])
    result["phantoms"] = _summary(made, alpha)
    tried = [*result["altered"].values(), result["phantoms"]]
    result["altered_and_phantoms"] = {"patients": sum(t["patients"] for t in tried),
                                      "flagged": sum(t["flagged"] for t in tried)}
    result["altered_and_phantoms"]["rate"] = round(result["altered_and_phantoms"]["flagged"]
                                                   / result["altered_and_phantoms"]["patients"], 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--alpha", type=float, default=anatomy.DEFAULT_ALPHA)
    parser.add_argument("--phantoms", type=int, default=20)
    parser.add_argument("--brief", action="store_true", help="counts only, without each patient's entry")
    args = parser.parse_args()
    result = measure(args.data_dir, args.alpha, args.phantoms)
    if args.brief:
        for entry in [result["training_left_out"], result["validation"], result["phantoms"],
                      *result["altered"].values()]:
            entry.pop("each")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
