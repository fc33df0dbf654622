"""The clinical DVH table on the CT's grid (``provided_code/dicom/dvh.py``) against structures of
known volume in doses of known gradient (``tests/kit/analytic_dvh.py``, whose closed forms are
checked here too): slices without contours, structures of few voxels or none, supersampling."""

import dataclasses
import math

import numpy as np
import pytest

pytest.importorskip("pydicom", reason="the dicom extra (pip install -e '.[dicom]') is not installed")

from provided_code.dicom.dvh import (SMALL_STRUCTURE_SUPERSAMPLE, SMALL_STRUCTURE_VOXELS, dvh_report,  # noqa: E402
                                     structures_of_rtstruct)
from provided_code.dicom.importer import import_patient  # noqa: E402
from provided_code.dicom.rtstruct import MAX_FILLED_GAP_MM  # noqa: E402
from provided_code.errors import ConfigError  # noqa: E402
from provided_code.metrics.dvh_table import clinical_dvh_of_values  # noqa: E402
from provided_code.sites import load_site  # noqa: E402
from tests.kit.analytic_dvh import (METRICS, CTGrid, Cylinder, Field, Sphere, analytic_table, compare,  # noqa: E402
                                    site_dict, write_phantom)

# A clinic's CT pixel (500 mm / 512) and slice, 32 × 32 × 16
GRID = CTGrid(pixel_mm=0.9765625, size=32, slice_mm=2.5, slices=16, top_z=20.0, origin=(-15.37, -15.61))
DZ = GRID.slice_mm
# Two cylinders of the same sub-pixel placement (12 pixels apart), one missing its contour on one slice
CYLINDER = Cylinder("Cylinder", (-6.2, -6.1), 3.5, -5.5 * DZ, 5.5 * DZ)
GAP = dataclasses.replace(CYLINDER, name="CylinderGap", centre=(-6.2 + 12 * GRID.pixel_mm, -6.1), skip=(-3 * DZ,))
TINY = Sphere("Tiny", (-6.13, 4.21, 0.0), 1.5)  # drawn on one slice only, a few voxels
SMALL = Sphere("Small", (5.37, 5.09, 0.0), 3.0)
# A speck midway between four pixel centres (0.69 mm from each): its contour holds none
SPECK = Sphere("Speck", (GRID.origin[0] + 8.5 * GRID.pixel_mm, GRID.origin[1] + 24.5 * GRID.pixel_mm, 0.0), 0.35)
STRUCTURES = [CYLINDER, GAP, TINY, SMALL, SPECK]
OBLIQUE = Field("oblique", (0.36, 0.48, 0.8), gy_at_origin=50.0, gradient=2.0)
ALONG_SLICES = Field("along slices", (0.0, 0.0, 1.0), gy_at_origin=50.0, gradient=2.0)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("analytic")
    ct_dir, rtstruct = write_phantom(folder, GRID, STRUCTURES, body_radius=14.0)
    report = import_patient(ct_dir, rtstruct, folder / "patient", site=load_site(site_dict(STRUCTURES)))
    return report, rtstruct


def _dose_ct(geometry, field: Field) -> np.ndarray:
    z, y, x = np.asarray(geometry.slice_z)[:, None, None], geometry.ct_y()[None, :, None], geometry.ct_x()[None, None, :]
    return field.at(x, y, z).astype(np.float32)


def _mean_error(table: dict, structure, field: Field) -> float:
    analytic = analytic_table(structure, field)
    return float(np.mean([abs(table[m] - analytic[m]) for m in METRICS]))


# -- the oracle ----------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", [Sphere("s", (1.0, -2.0, 3.0), 4.0), Cylinder("c", (1.0, -2.0), 3.0, -5.0, 9.0)])
def test_the_closed_forms_are_the_distributions_of_random_points(structure):
    """Oracle of the oracle: 400 000 points drawn uniformly inside the solid (rejection from its
    bounding box), their doses' fraction above each analytic Dx and their mean."""
    rng = np.random.default_rng(0)
    if isinstance(structure, Sphere):
        points = rng.uniform(-1, 1, (800_000, 3)) * structure.radius
        points = points[np.sum(points ** 2, axis=1) <= structure.radius ** 2] + structure.middle
    else:
        angle, radius = rng.uniform(0, 2 * np.pi, 400_000), structure.radius * np.sqrt(rng.uniform(0, 1, 400_000))
        points = np.stack([structure.centre[0] + radius * np.cos(angle), structure.centre[1] + radius * np.sin(angle),
                           rng.uniform(structure.z_low, structure.z_high, 400_000)], axis=1)
    dose = OBLIQUE.at(points[:, 0], points[:, 1], points[:, 2])
    table = analytic_table(structure, OBLIQUE)
    for metric, percent in (("D99", 99), ("D95", 95), ("D50", 50), ("D1", 1)):
        above = float(np.mean(dose >= table[metric]))
        # four binomial standard errors of a fraction over this many points
        assert above == pytest.approx(percent / 100, abs=4 * math.sqrt(0.25 / dose.size)), metric
    # four standard errors of the mean
    assert dose.mean() == pytest.approx(table["Dmean"], abs=4 * dose.std() / math.sqrt(dose.size))
    assert dose.max() <= table["Dmax"] and dose.max() == pytest.approx(table["Dmax"], abs=0.05 * OBLIQUE.gradient)


# -- slices without contours ---------------------------------------------------------------------
def test_a_slice_without_a_contour_inside_an_roi_takes_its_neighbours(imported):
    """A cylinder missing its contour on one slice is tabulated as the whole cylinder: the same
    voxels, slice by slice, as its twin drawn on every slice, so the same table in a dose that
    changes along the slices (where a slice left out shifts D50 by a slice's dose), and a warning."""
    report, _ = imported
    geometry = report.geometry
    plane = geometry.rows * geometry.columns
    whole, gap = report.ct_voxels[CYLINDER.name], report.ct_voxels[GAP.name]
    assert gap.size == whole.size
    assert np.array_equal(np.bincount(gap // plane, minlength=GRID.slices), np.bincount(whole // plane, minlength=GRID.slices))
    dose = _dose_ct(geometry, ALONG_SLICES).reshape(-1)
    table = clinical_dvh_of_values({key: dose[report.ct_voxels[key]] for key in (CYLINDER.name, GAP.name)})
    assert table[GAP.name] == table[CYLINDER.name]
    skipped = list(GRID.slice_z).index(GAP.skip[0])
    assert [line for line in report.lines if GAP.name in line and "warning" in line] == [
        f"warning: {GAP.name} ({GAP.name!r}) has contours on 10 of the 11 CT slices from z = {CYLINDER.z_high - DZ / 2:g} "
        f"to {CYLINDER.z_low + DZ / 2:g} mm (none at z = {GRID.slice_z[skipped]:g} mm); the 1 slices without are "
        f"filled from the nearer contoured slice"]


def test_a_gap_longer_than_the_filled_one_stays_empty(tmp_path):
    """Slices without contours over more than MAX_FILLED_GAP_MM: two parts of one ROI, left apart."""
    missing = int(MAX_FILLED_GAP_MM // DZ) + 1
    apart = dataclasses.replace(CYLINDER, name="Apart", skip=tuple(-DZ * k for k in range(-1, missing - 1)))
    ct_dir, rtstruct = write_phantom(tmp_path, GRID, [apart], body_radius=14.0)
    report = import_patient(ct_dir, rtstruct, tmp_path / "patient", site=load_site(site_dict([apart])))
    plane = report.geometry.rows * report.geometry.columns
    drawn = {int(round((GRID.top_z - z) / DZ)) for z in GRID.slice_z if apart.radius_at(z) > 0 and z not in apart.skip}
    assert set(np.unique(report.ct_voxels[apart.name] // plane).tolist()) == drawn
    assert any(f"the {missing} slices without are in runs of more than {MAX_FILLED_GAP_MM:g} mm, empty in its mask" in line
               for line in report.lines)


# -- structures of few voxels, or none -----------------------------------------------------------
def test_a_structure_whose_contour_holds_no_voxel_centre_is_in_the_table(imported):
    report, _ = imported
    assert report.ct_voxels[SPECK.name].size == 0  # the plain table had no row for it
    table = dvh_report(report.geometry, report.ct_voxels, report.contours,
                       {"predicted": _dose_ct(report.geometry, OBLIQUE)})
    assert table["supersampled"][SPECK.name] == SMALL_STRUCTURE_SUPERSAMPLE
    # its contour, one slice thick: the slab's sub-voxel centres are symmetric about the sphere's centre along z,
    # in-plane within a sub-voxel of it (the gradient times a sub-voxel's size)
    tolerance = OBLIQUE.gradient * GRID.pixel_mm / SMALL_STRUCTURE_SUPERSAMPLE
    assert table["predicted"][SPECK.name]["Dmean"] == pytest.approx(analytic_table(SPECK, OBLIQUE)["Dmean"], abs=tolerance)
    slab_cc = math.pi * SPECK.radius ** 2 * DZ / 1000  # its contour's area (the polygon's, equal) one slice thick
    # the disc's area counted in sub-pixels of (pixel / 4)²: within a ring of sub-pixels around its edge
    ring_cc = 2 * math.pi * SPECK.radius * (GRID.pixel_mm / SMALL_STRUCTURE_SUPERSAMPLE) * DZ / 1000
    assert table["volume_cc"][SPECK.name] == pytest.approx(slab_cc, abs=ring_cc)


def test_a_structure_of_few_voxels_is_supersampled_and_closer_to_its_closed_form(imported):
    report, _ = imported
    assert 0 < report.ct_voxels[TINY.name].size < SMALL_STRUCTURE_VOXELS <= report.ct_voxels[CYLINDER.name].size
    dose = _dose_ct(report.geometry, OBLIQUE)
    table = dvh_report(report.geometry, report.ct_voxels, report.contours, {"predicted": dose})
    assert table["supersampled"] == {TINY.name: SMALL_STRUCTURE_SUPERSAMPLE, SMALL.name: SMALL_STRUCTURE_SUPERSAMPLE,
                                     SPECK.name: SMALL_STRUCTURE_SUPERSAMPLE}
    assert table["grid"]["supersample"] == 1
    at_centres = clinical_dvh_of_values({TINY.name: dose.reshape(-1)[report.ct_voxels[TINY.name]]})[TINY.name]
    assert _mean_error(table["predicted"][TINY.name], TINY, OBLIQUE) < _mean_error(at_centres, TINY, OBLIQUE)
    # the others keep their voxel centres
    assert table["predicted"][CYLINDER.name] == clinical_dvh_of_values(
        {CYLINDER.name: dose.reshape(-1)[report.ct_voxels[CYLINDER.name]]})[CYLINDER.name]


def test_a_supersampled_table_is_closer_to_the_closed_forms_than_the_voxel_centres(imported):
    """In an oblique gradient, over every structure and metric: the mean error of 4 × 4 × 4
    sub-voxels against that of the voxel centres (a structure without a voxel centre left out)."""
    report, _ = imported
    dose = _dose_ct(report.geometry, OBLIQUE)
    fine = dvh_report(report.geometry, report.ct_voxels, report.contours, {"predicted": dose}, supersample=4)
    assert fine["supersampled"] == {s.name: max(4, SMALL_STRUCTURE_SUPERSAMPLE) for s in STRUCTURES}
    at_centres = clinical_dvh_of_values({key: dose.reshape(-1)[v] for key, v in report.ct_voxels.items()})
    kept = [s for s in STRUCTURES if s.name in at_centres]
    assert np.mean([_mean_error(fine["predicted"][s.name], s, OBLIQUE) for s in kept]) < \
        np.mean([_mean_error(at_centres[s.name], s, OBLIQUE) for s in kept])


def test_a_supersampled_uniform_dose_is_that_dose_and_the_volume_the_contours(imported):
    report, _ = imported
    uniform = Field("uniform", None, gy_at_origin=42.0)
    table = dvh_report(report.geometry, report.ct_voxels, report.contours,
                       {"predicted": _dose_ct(report.geometry, uniform)}, supersample=3)
    for s in STRUCTURES:
        assert table["predicted"][s.name] == pytest.approx({m: 42.0 for m in METRICS}, abs=1e-5)  # float32's 42
    # the cylinders' contours (polygons of the circle's area), one slice thick each: within a ring of sub-pixels
    ring_cc = 2 * math.pi * CYLINDER.radius * (GRID.pixel_mm / 3) * (CYLINDER.z_high - CYLINDER.z_low) / 1000
    for cylinder in (CYLINDER, GAP):
        assert table["volume_cc"][cylinder.name] == pytest.approx(CYLINDER.volume_mm3 / 1000, abs=ring_cc)


def test_the_supersampling_is_refused_outside_its_range(imported):
    report, _ = imported
    for wrong in (0, 9, 2.5, True):
        with pytest.raises(ConfigError, match=r"Invalid `--dvh-supersample`\. Expected a whole number from 1 to 8"):
            dvh_report(report.geometry, report.ct_voxels, report.contours, {"predicted": np.zeros(1)}, supersample=wrong)


def test_the_structures_read_again_from_the_rtstruct_are_the_imports(imported):
    report, rtstruct = imported
    ct_voxels, contours = structures_of_rtstruct(rtstruct, report.geometry)
    assert list(ct_voxels) == list(report.ct_voxels)
    for key in ct_voxels:
        assert np.array_equal(ct_voxels[key], report.ct_voxels[key]), key
        assert list(contours[key]) == list(report.contours[key])


# -- the analytic check (scripts/dvh_analytic.py) -------------------------------------------------
@pytest.mark.filterwarnings("ignore:The 'pydicom.pixel_data_handlers' module:DeprecationWarning")
def test_the_analytic_check_against_dicompyler_core(tmp_path, monkeypatch):
    """The script's comparison on the small grid: every method's row, and two findings about
    dicompyler-core 0.5.6 that docs/dicom.md reports: a structure drawn on one slice has no DVH in
    it (its slice thickness is the smallest distance between the ROI's planes: none), and with
    its in-plane interpolation the dose is read half a dose-grid pixel off the structure (all
    its figures off by that times the gradient, where the plain ones agree with ours)."""
    pytest.importorskip("dicompylercore", reason="dicompyler-core (the dev extra) is not installed")
    import pydicom.dicomio

    monkeypatch.setattr(pydicom.dicomio, "read_file", pydicom.dcmread, raising=False)  # imported by its 0.5.6
    from dicompylercore import dvhcalc

    across_rows = Field("across rows", (0.0, 1.0, 0.0), gy_at_origin=50.0, gradient=2.0)
    result = compare(tmp_path, GRID, [CYLINDER, TINY], fields=(across_rows,), supersample=(4,), dicompyler=dvhcalc,
                     dicompyler_options={"interpolation_resolution": GRID.pixel_mm / 4,
                                         "interpolation_segments_between_planes": 3})
    rows = result["fields"]["across rows"]["structures"]
    assert set(rows[CYLINDER.name]) == {"analytic", "ours", "ours_voxel_centres", "ours_supersampled_4", "dicompyler",
                                        "dicompyler_interpolated", "difference"}
    assert rows[TINY.name]["absent"] == ["dicompyler", "dicompyler_interpolated"]
    # plain: the same voxels as ours; its mean from 0.01 Gy bins' centres
    assert rows[CYLINDER.name]["dicompyler"]["Dmean"] == pytest.approx(rows[CYLINDER.name]["ours"]["Dmean"], abs=0.006)
    half_pixel_gy = across_rows.gradient * GRID.pixel_mm / 2
    shift = rows[CYLINDER.name]["dicompyler_interpolated"]["Dmean"] - rows[CYLINDER.name]["ours_supersampled_4"]["Dmean"]
    # its bins (0.01 Gy) and its sampling of the contour apart, the shift is half a pixel's dose
    assert shift == pytest.approx(-half_pixel_gy, abs=0.1 * half_pixel_gy)
