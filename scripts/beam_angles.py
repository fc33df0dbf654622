#!/usr/bin/env python
"""Where OpenKBP's nine beams point, read off the reference doses; prints one JSON object.

    python scripts/beam_angles.py ../shared/openkbp-sample ../shared/openkbp-more

Every OpenKBP plan was delivered with nine equidistant coplanar beams, but the files do not say
at which angles. Outside the targets the beams' paths show as streaks of dose, brightest on the
side each beam enters by. For each candidate phase p (0°, 1°, …, 39°: the beams at gantry angles
p, p + 40, …, p + 320) this counts, per voxel, how many of the nine beams pass through it on their
way in to a target (on a line of the beam that crosses a target voxel of the same axial slice,
between the source and that target; ``provided_code/beams.py`` gives the lines and the
angle convention), and correlates that count with the reference dose over the body's voxels
outside the targets, in the slices that hold a target. Each patient's phase is the one with the
highest correlation. Entrances and exits are 20° apart for nine beams (180 = 4 × 40 + 20), so the
entrance side is what tells p from p + 20; the correlation at p + 20 is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from provided_code.sites import openkbp
from provided_code.data.csv_io import read_patient
from provided_code.beams import ray_bins, ray_count

PHASES = np.arange(40)


def entrance_counts(targets: np.ndarray, size: int, tables: dict) -> dict[int, np.ndarray]:
    """Per gantry angle (whole degrees), the voxels ``(R*R, slices)`` between the source and the
    targets on the beam's lines that cross a target."""
    flat = targets.reshape(size * size, -1)
    voxels, slices = np.nonzero(flat)
    upstream = {}
    for angle, (bins, toward_source) in tables.items():
        farthest = np.full((ray_count(size), flat.shape[1]), -np.inf)  # per line and slice: the target
        np.maximum.at(farthest, (bins[voxels], slices), toward_source[voxels])  # voxel nearest the source
        line = farthest[bins]
        upstream[angle] = np.isfinite(line) & (toward_source[:, None] > line)
    return upstream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="data folders holding */pt_<N>/ patient folders with dose.csv")
    args = parser.parse_args()
    patients = sorted(p for folder in args.folders for p in Path(folder).glob("*-pats/pt_*")
                      if (p / "dose.csv").is_file())
    tables = {}
    per_patient = {}
    profiles = []  # per patient, the correlation at each phase
    for folder in patients:
        patient = read_patient(folder, site=openkbp())
        size = patient.dose.shape[0]
        if not tables:
            i, j = np.meshgrid(np.arange(size) - size / 2, np.arange(size) - size / 2, indexing="ij")
            tables = {angle: (ray_bins(size, angle), (-i * math.cos(math.radians(angle))
                                                       + j * math.sin(math.radians(angle))).reshape(-1))
                      for angle in range(360)}
        targets = (patient.structure_masks & openkbp().target_bits) != 0
        held = np.flatnonzero(targets.any(axis=(0, 1)))
        if held.size == 0:
            continue
        targets = targets[:, :, held]
        region = (patient.possible_dose_mask[:, :, held] & ~targets).reshape(size * size, -1)
        dose = patient.dose[:, :, held].reshape(size * size, -1)[region]
        upstream = entrance_counts(targets, size, tables)
        correlation = []
        for phase in PHASES:
            count = sum(upstream[(phase + 40 * k) % 360] for k in range(9))[region].astype(np.float64)
            correlation.append(float(np.corrcoef(count, dose)[0, 1]))
        best = int(np.argmax(correlation))
        profiles.append(correlation)
        per_patient[folder.name] = {"phase": best, "correlation": round(correlation[best], 3),
                                    "correlation_20_away": round(correlation[(best + 20) % 40], 3)}

    phases = [p["phase"] for p in per_patient.values()]
    unit = np.exp(2j * np.pi * np.array(phases) / 40)
    counts = np.bincount(phases, minlength=40)
    print(json.dumps({
        "convention": "IEC gantry angles, head-first supine: source direction (-cos g, sin g) in (axis 0, axis 1)",
        "patients": len(per_patient),
        "circular_mean_phase": float(np.angle(unit.mean()) / (2 * np.pi) * 40 % 40),
        "concentration": float(abs(unit.mean())),  # 1: every patient agrees; 0: no preferred phase
        "within_5_degrees_of_mean": int(sum(abs((p - np.angle(unit.mean()) / (2 * np.pi) * 40 + 20) % 40 - 20) <= 5
                                            for p in phases)),
        "phase_of_mean_correlation": int(np.argmax(np.mean(profiles, axis=0))),
        "mean_correlation_by_phase": [round(float(c), 4) for c in np.mean(profiles, axis=0)],
        "patients_by_phase": {int(p): int(c) for p, c in enumerate(counts) if c},
        "per_patient": per_patient,
    }, indent=2))


if __name__ == "__main__":
    main()
