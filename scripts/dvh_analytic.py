"""The clinical DVH table against DVH metrics known in closed form; prints one JSON object.

    python scripts/dvh_analytic.py [--pixel-mm 0.9765625] [--slice-mm 2.5] [--gradient 2] [--supersample 2 4 8]
                                   [--dicompyler-resolution 4] [--dicompyler-segments 3] [--no-dicompyler]
    python scripts/dvh_analytic.py --sizes

Structures of known volume (a target-sized sphere, spheres of a few dozen and of a few voxels, a
cord-sized cylinder, the same cylinder with its contour missing on one slice: ``tests/kit/analytic_dvh.py``)
drawn on a CT as a planning system draws them, in a uniform dose and in doses of ``--gradient``
Gy/mm across the slices' rows, along the slice axis and obliquely. For each structure and metric:
the closed form (``analytic``); the package's table as ``openkbp-dicom predict`` computes it from
``RD.dcm`` and the RTSTRUCT (``ours``, and ``ours_supersampled_<N>`` with ``--dvh-supersample N``);
dicompyler-core's from the same files (``dicompyler``), and with its supersampling in-plane (a
dose-grid pixel over ``--dicompyler-resolution``) and its interpolation between planes
(``--dicompyler-segments``) (``dicompyler_interpolated``); the differences from the closed form
(Gy; cm³ for the volume) and, per method, their mean and largest size over the gradients.
``--sizes``: spheres of 1 to 7 mm radius at random places instead, per radius the errors of the
voxel centres and of 4 × 4 × 4 sub-voxels (how ``SMALL_STRUCTURE_VOXELS`` was chosen). Needs
pydicom, and dicompyler-core (the dev extra) unless ``--no-dicompyler`` or ``--sizes``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pixel-mm", type=float, default=0.9765625, help="CT pixel (500 mm / 512)")
    parser.add_argument("--slice-mm", type=float, default=2.5, help="CT slice spacing")
    parser.add_argument("--gradient", type=float, default=2.0, help="Gy/mm of the graded doses")
    parser.add_argument("--supersample", type=int, nargs="*", default=[2, 4, 8], help="our supersampled tables' N")
    parser.add_argument("--dicompyler-resolution", type=int, default=4,
                        help="dicompyler-core's interpolation_resolution: the pixel over this (a power of 2)")
    parser.add_argument("--dicompyler-segments", type=int, default=3,
                        help="dicompyler-core's interpolation_segments_between_planes")
    parser.add_argument("--no-dicompyler", action="store_true", help="our table and the closed form only")
    parser.add_argument("--keep", default=None, help="write the DICOM files here (default: a temporary folder)")
    parser.add_argument("--sizes", action="store_true",
                        help="instead: spheres of 1 to 7 mm radius at random places, 2.0, 2.5 and 3.0 mm slices, five "
                             "gradients; per radius the voxel centres' errors against 4 × 4 × 4 sub-voxels'")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))  # the tests' kit (tests/kit/): not installed with the package
    from tests.kit.analytic_dvh import DEFAULT_FIELDS, CTGrid, Field, compare, default_structures

    if args.sizes:
        result = sizes(args)
        print(json.dumps(result, indent=1))
        return result
    dvhcalc = None
    if not args.no_dicompyler:
        import pydicom.dicomio

        if not hasattr(pydicom.dicomio, "read_file"):  # dicompyler-core 0.5.6 imports it; pydicom 3 removed it
            pydicom.dicomio.read_file = pydicom.dcmread
        from dicompylercore import dvhcalc
    slices = 32
    grid = CTGrid(pixel_mm=args.pixel_mm, slice_mm=args.slice_mm, slices=slices,
                  top_z=(slices // 2) * args.slice_mm)
    # the graded doses scaled as a whole: every structure's doses stay positive, as at 2 Gy/mm
    fields = [field if field.direction is None else
              Field(field.name, field.direction, field.gy_at_origin * args.gradient / 2.0, args.gradient)
              for field in DEFAULT_FIELDS]
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="dvh-analytic-"))
    try:
        result = compare(folder, grid, default_structures(grid), fields, supersample=tuple(args.supersample),
                         dicompyler=dvhcalc,
                         dicompyler_options={"interpolation_resolution": args.pixel_mm / args.dicompyler_resolution,
                                             "interpolation_segments_between_planes": args.dicompyler_segments})
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    result["settings"] = vars(args)
    print(json.dumps(result, indent=1))
    return result


def sizes(args, radii=(7.0, 5.0, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0), placements=9, seed=7) -> dict:
    """Spheres of each radius at ``placements`` random places (centres anywhere within a pixel and a
    slice), in five graded doses (across rows, along the slices, three oblique), at three slice
    spacings: per radius the voxel centres' and 4 × 4 × 4 sub-voxels' errors (every metric)."""
    import numpy as np

    from tests.kit.analytic_dvh import METRICS, CTGrid, Field, Sphere, compare

    rng = np.random.default_rng(seed)
    fields = [Field(name, direction, 150.0, args.gradient) for name, direction in (
        ("across_rows", (0.0, 1.0, 0.0)), ("along_slices", (0.0, 0.0, 1.0)), ("oblique", (0.36, 0.48, 0.8)),
        ("oblique_2", (-0.6, 0.1, 0.79)), ("in_plane", (0.8, 0.6, 0.0)))]
    per_batch = 3  # a site holds at most 32 structures: three places of each radius at once
    out = {}
    for slice_mm in (2.0, 2.5, 3.0):
        grid = CTGrid(pixel_mm=args.pixel_mm, slice_mm=slice_mm, top_z=16 * slice_mm)
        errors = {r: {"voxels": [], "voxel_centres": [], "supersampled_4": []} for r in radii}
        for batch in range(placements // per_batch):
            spheres = [Sphere(f"R{k}_{j}", (-30 + 25 * j + rng.uniform(-1, 1), -48 + 12 * k + rng.uniform(-1, 1),
                                            rng.uniform(-slice_mm / 2, slice_mm / 2)), r)
                       for k, r in enumerate(radii) for j in range(per_batch)]  # the largest first: the site's target
            folder = Path(tempfile.mkdtemp(prefix="dvh-sizes-"))
            try:
                result = compare(folder, grid, spheres, fields, supersample=(4,))
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            for sphere in spheres:
                entry = errors[sphere.radius]
                entry["voxels"].append(result["structures"][sphere.name]["ct_voxels"])
                for field in fields:
                    row = result["fields"][field.name]["structures"][sphere.name]
                    for method, key in (("ours_voxel_centres", "voxel_centres"), ("ours_supersampled_4", "supersampled_4")):
                        if method in row["difference"]:
                            entry[key] += [abs(row["difference"][method][m]) for m in METRICS]
        out[f"{slice_mm:g}"] = {f"{r:g}": {"voxels": [min(e["voxels"]), max(e["voxels"])],
                                           "spheres": len(e["voxels"]),
                                           "without_a_voxel_centre": sum(v == 0 for v in e["voxels"]),
                                           **{key: {"mean_abs_gy": float(np.mean(e[key])), "max_abs_gy": float(np.max(e[key]))}
                                              for key in ("voxel_centres", "supersampled_4") if e[key]}}
                                for r, e in errors.items()}
    return {"sizes": out, "settings": {"pixel_mm": args.pixel_mm, "gradient": args.gradient, "placements": placements,
                                       "seed": seed}}


if __name__ == "__main__":
    main()
