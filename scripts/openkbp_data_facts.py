"""Facts of the OpenKBP patients that the DICOM import relies on; prints one JSON object.

    python scripts/openkbp_data_facts.py ../shared/openkbp-sample ../shared/openkbp-more

- the CT grey values' offset from HU: the body's histogram peaks for fat and soft tissue, and
  where the whole volume's low values peak (an offset of 1000 puts air at 0, 1024 at 24);
- where the targets' centre sits along the slice axis (the import centres its 128 slices there);
- the voxel sizes (the import warns outside their range).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from provided_code.sites import openkbp
from provided_code.data.csv_io import read_patient


def _smoothed(histogram: np.ndarray) -> np.ndarray:
    kernel = np.exp(-0.5 * (np.arange(-15, 16) / 5.0) ** 2)
    return np.convolve(histogram.astype(float), kernel / kernel.sum(), "same")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="data folders holding */pt_<N>/ patient folders")
    args = parser.parse_args()
    patients = sorted(p for folder in args.folders for p in Path(folder).glob("*-pats/pt_*") if p.is_dir())
    fat, soft, low_peak, zero, target_centre, spacing = [], [], [], [], [], []
    for folder in patients:
        patient = read_patient(folder, require_dose=False, site=openkbp())
        ct = patient.ct.astype(np.int64)
        body = _smoothed(np.bincount(ct[patient.possible_dose_mask], minlength=4096))
        peak = 800 + int(np.argmax(body[800:990]))
        if 805 < peak < 985:  # a peak inside the window, not its edge
            fat.append(peak)
        soft.append(990 + int(np.argmax(body[990:1150])))
        zero.append(float(np.mean(ct == 0)))
        low_peak.append(1 + int(np.argmax(_smoothed(np.bincount(ct.ravel(), minlength=4096))[1:200])))
        targets = np.argwhere((patient.structure_masks & openkbp().target_bits) != 0)
        if targets.size:
            target_centre.append(float(targets[:, 2].mean()))
        spacing.append(patient.voxel_dimensions)

    def spread(values):
        return {"median": float(np.median(values)), "p10": float(np.percentile(values, 10)),
                "p90": float(np.percentile(values, 90)), "n": len(values)}

    spacing = np.array(spacing)
    print(json.dumps({
        "patients": len(patients),
        "fat_peak_ct_value": spread(fat),
        "soft_tissue_peak_ct_value": spread(soft),
        "zero_fraction": {"min": min(zero), "max": max(zero)},
        "low_values_peak_ct_value": {"values": sorted(set(low_peak)), "patients": len(low_peak)},
        "target_centre_slice": {"mean": float(np.mean(target_centre)), "min": float(np.min(target_centre)),
                                "max": float(np.max(target_centre))},
        "voxel_mm_min": spacing.min(axis=0).tolist(), "voxel_mm_median": np.median(spacing, axis=0).tolist(),
        "voxel_mm_max": spacing.max(axis=0).tolist(),
    }, indent=2))


if __name__ == "__main__":
    main()
