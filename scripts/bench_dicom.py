"""DICOM import and export of a clinic-sized patient on this machine; prints one JSON object.

    python scripts/bench_dicom.py [--factor 4] [--extra-slices 20]

A phantom written as a clinic exports it (``provided_code/dicom/synthetic.py``: needs the dev
extra for scikit-image): a CT of 128·factor pixels square, 128 + 2 × extra slices, 11
ROIs and an RT Dose; then ``openkbp-dicom import`` and ``export`` as functions, timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=int, default=4, help="in-plane pixels per OpenKBP voxel (4: 512 × 512)")
    parser.add_argument("--extra-slices", type=int, default=20, help="air slices above and below the 128")
    args = parser.parse_args()
    from provided_code.constants import STRUCTURES
    from provided_code.data.phantoms import make_phantom
    from provided_code.dicom.exporter import export_dose
    from provided_code.dicom.importer import import_patient
    from provided_code.dicom.synthetic import write_patient

    workdir = Path(tempfile.mkdtemp(prefix="bench-dicom-"))
    try:
        volumes = make_phantom(4)
        masks = {name: volumes[name] for name in STRUCTURES}
        masks["BODY"] = volumes["possible_dose_mask"]
        written = write_patient(workdir / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"],
                                volumes["dose"], factor=args.factor, extra_slices=(args.extra_slices,) * 2)
        start = time.perf_counter()
        import_patient(written.ct_dir, written.rtstruct, workdir / "pt_1", rtdose=written.rtdose)
        import_s = time.perf_counter() - start
        start = time.perf_counter()
        export_dose(workdir / "pt_1", volumes["dose"], workdir / "RD.dcm", nifti=workdir / "dose.nii.gz")
        export_s = time.perf_counter() - start
        print(json.dumps({
            "ct_shape": [128 * args.factor, 128 * args.factor, 128 + 2 * args.extra_slices], "rois": len(masks),
            "import_s": import_s, "export_s": export_s,
            "rtdose_mb": (workdir / "RD.dcm").stat().st_size / 1e6,
            "nifti_mb": (workdir / "dose.nii.gz").stat().st_size / 1e6,
        }, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
