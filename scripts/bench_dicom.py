"""DICOM import and export of a clinic-sized patient on this machine; prints one JSON object.

    python scripts/bench_dicom.py [--factor 4] [--extra-slices 20] [--repeats 2]

A phantom written as a clinic exports it (``tests/kit/synthetic.py``: needs the dev
extra for scikit-image): a CT of 128·factor pixels square, 128 + 2 × extra slices, 15 ROIs (the
11 the import reads and 4 it leaves), an RT Plan and an RT Dose referencing it; then
``openkbp-dicom import`` and ``export`` as functions, timed, and ``openkbp-dicom import-cohort``
on the same files as an archive (scanning, linking, choosing the plan, importing with the plan's
files): ``cohort_import_s_per_patient`` against ``import_s`` (``cohort_over_single_import``, at
most 1.2), and the patients per minute that makes. The two imports alternate ``--repeats`` times;
each figure is the fastest of its runs (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factor", type=int, default=4, help="in-plane pixels per OpenKBP voxel (4: 512 × 512)")
    parser.add_argument("--extra-slices", type=int, default=20, help="air slices above and below the 128")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each import, alternating")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))  # the tests' kit (tests/kit/): not installed with the package
    from provided_code.sites import openkbp
    from provided_code.data.phantoms import make_phantom
    from provided_code.dicom.cohort import import_cohort
    from provided_code.dicom.exporter import export_dose
    from provided_code.dicom.importer import import_patient
    from tests.kit.synthetic import write_dose, write_patient, write_plan

    workdir = Path(tempfile.mkdtemp(prefix="bench-dicom-"))
    try:
        volumes = make_phantom(4)
        masks = {name: volumes[name] for name in openkbp().names}
        masks["BODY"] = volumes["possible_dose_mask"]
        body = volumes["possible_dose_mask"]
        for name, shift in (("Ring_PTV", 2), ("Couch", -3), ("zOpt_PTV", 4), ("Brain_PRV", -5)):  # ROIs not read
            masks[name] = np.roll(volumes["PTV70"], shift, axis=0) & body
        written = write_patient(workdir / "clinic", volumes["ct"], masks, volumes["voxel_dimensions"],
                                factor=args.factor, extra_slices=(args.extra_slices,) * 2)
        plan = write_plan(workdir / "clinic" / "RP.dcm", written, [("static", a) for a in range(0, 360, 40)],
                          {"PTV_7000": 70.0, "PTV63": 63.0, "PTV_56": 56.0})
        rtdose = write_dose(workdir / "clinic" / "RD.dcm", volumes["dose"], written, plan)
        import_runs, cohort_runs = [], []
        for run in range(args.repeats):
            start = time.perf_counter()
            import_patient(written.ct_dir, written.rtstruct, workdir / "pt_1", rtdose=rtdose, site=openkbp())
            import_runs.append(time.perf_counter() - start)
            start = time.perf_counter()
            report = import_cohort(workdir / "clinic", workdir / f"cohort-{run}", site=openkbp(),
                                   validation=0)
            cohort_runs.append(time.perf_counter() - start)
            if report.counts["imported"] != 1:
                raise SystemExit(f"the cohort import did not import the patient: {report.counts}")
        import_s, cohort_s = min(import_runs), min(cohort_runs)
        start = time.perf_counter()
        export_dose(workdir / "pt_1", volumes["dose"], workdir / "RD.dcm", site=openkbp(), nifti=workdir / "dose.nii.gz")
        export_s = time.perf_counter() - start
        print(json.dumps({
            "ct_shape": [128 * args.factor, 128 * args.factor, 128 + 2 * args.extra_slices], "rois": len(masks),
            "import_s": import_s, "export_s": export_s,
            "cohort_import_s_per_patient": cohort_s, "cohort_over_single_import": cohort_s / import_s,
            "cohort_patients_per_minute": 60.0 / cohort_s, "import_runs_s": import_runs, "cohort_runs_s": cohort_runs,
            "rtdose_mb": (workdir / "RD.dcm").stat().st_size / 1e6,
            "nifti_mb": (workdir / "dose.nii.gz").stat().st_size / 1e6,
        }, indent=2))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
