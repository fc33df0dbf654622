import filecmp

import numpy as np

from provided_code.sites import openkbp
from provided_code.data.csv_io import read_patient
from provided_code.data.phantoms import make_phantom, write_phantom_patient

PRESCRIPTIONS_GY = openkbp().prescriptions_gy
STRUCTURES = openkbp().names  # OpenKBP's channel order
TARGETS = openkbp().targets


def test_phantom_is_deterministic_by_seed(tmp_path):
    a = write_phantom_patient(tmp_path / "a" / "pt_1", seed=5)
    b = write_phantom_patient(tmp_path / "b" / "pt_1", seed=5)
    c = write_phantom_patient(tmp_path / "c" / "pt_1", seed=6)
    names = sorted(p.name for p in a.iterdir())
    assert filecmp.cmpfiles(a, b, names, shallow=False)[0] == names
    assert not filecmp.cmp(a / "dose.csv", c / "dose.csv", shallow=False)


def test_phantom_dose_is_plausible():
    volumes = make_phantom(11)
    dose, body = volumes["dose"], volumes["possible_dose_mask"]
    assert np.all(dose[~body] == 0)
    for name in TARGETS:
        assert volumes[name].any()
        assert abs(np.median(dose[volumes[name]]) - PRESCRIPTIONS_GY[name]) < 1.0
    assert not (volumes["PTV70"] & volumes["PTV63"]).any() and not (volumes["PTV63"] & volumes["PTV56"]).any()
    assert dose[volumes["Brainstem"]].mean() < 0.3 * PRESCRIPTIONS_GY["PTV70"]
    assert dose[body].mean() < dose[volumes["PTV56"]].mean()
    assert all(volumes[name].any() for name in STRUCTURES)


def test_phantom_reads_as_an_openkbp_patient(tmp_path):
    folder = write_phantom_patient(tmp_path / "pt_3", seed=3, with_dose=False)
    patient = read_patient(folder, require_dose=False, site=openkbp())
    assert patient.dose is None and patient.ct.max() > 1000
    assert len(list(folder.glob("*.csv"))) == 13


# -- prostate phantoms ------------------------------------------------------------------------------
import pytest  # noqa: E402

from provided_code.data.patient_plan import read_beams, read_prescriptions  # noqa: E402
from provided_code.data.phantoms import (  # noqa: E402
    OWN_PRESCRIPTIONS_GY,
    SEVEN_FIELDS,
    PhantomSiteError,
    make_prostate_phantom,
    write_prostate_phantom,
    write_site_phantom,
)
from provided_code.beams import beam_voxels  # noqa: E402
from provided_code.sites import load_site  # noqa: E402
from tests.kit.tiers import SLOW_FOR_ITS_TIME

PROSTATE = load_site("prostate")


@pytest.fixture(scope="module")
def seven_fields():
    """A prostate phantom treated with seven static fields (its own plan)."""
    return make_prostate_phantom(4, gantry_angles=SEVEN_FIELDS, site=PROSTATE)


def centroid(mask):
    return np.array([np.mean(axis) for axis in np.nonzero(mask)])


def test_prostate_phantom_anatomy_and_dose_at_the_prescriptions():
    volumes = make_prostate_phantom(12, site=PROSTATE)  # the site's two arcs, every 10°
    dose, body = volumes["dose"], volumes["possible_dose_mask"]
    assert all(volumes[name].any() for name in PROSTATE.names) and np.all(dose[~body] == 0)
    assert not (volumes["PTV78"] & volumes["PTV60"]).any()  # stored disjoint: a voxel of both is PTV78's
    prostate, rectum, bladder = centroid(volumes["PTV78"]), centroid(volumes["Rectum"]), centroid(volumes["Bladder"])
    assert rectum[0] > prostate[0] + 5  # behind
    assert bladder[0] < prostate[0] and bladder[2] < prostate[2]  # in front, above
    right, left = centroid(volumes["FemoralHead_R"])[1], centroid(volumes["FemoralHead_L"])[1]
    assert right < prostate[1] - 15 and left > prostate[1] + 15  # axis 1 runs from the patient's right to left
    assert dose[volumes["PTV78"]].mean() == pytest.approx(78.0, abs=0.01)  # the highest target's mean: its prescription
    assert np.percentile(dose[volumes["PTV78"]], 5) > 0.9 * 78  # D95
    assert np.percentile(dose[volumes["PTV60"]], 5) > 0.95 * 60 and dose[volumes["PTV60"]].mean() < 72
    for organ in ("Rectum", "Bladder"):
        assert dose[volumes[organ]].mean() < 0.5 * 78, organ
    for head in ("FemoralHead_R", "FemoralHead_L"):
        assert dose[volumes[head]].mean() < 0.3 * 78, head


def test_prostate_dose_follows_its_beams():
    """Around the targets, at one distance from their centre (so at about one depth), the voxels on
    a beam's path get many times the dose of those off every path (three fields: with seven or an
    arc, the paths of a pelvis-sized target leave no voxel near it off every path)."""
    angles = (0.0, 120.0, 240.0)
    volumes = make_prostate_phantom(4, gantry_angles=angles, site=PROSTATE)
    targets = volumes["PTV78"] | volumes["PTV60"]
    on_path = np.zeros_like(targets)
    for angle in angles:
        on_path |= beam_voxels(targets, angle)
    near_path = on_path.copy()
    for axis in (0, 1):  # off every path by three voxels at least (out of the penumbra)
        for shift in (-3, -2, -1, 1, 2, 3):
            near_path |= np.roll(on_path, shift, axis)
    centre = centroid(volumes["PTV78"])
    k = int(round(centre[2]))
    i, j = np.ogrid[0:128, 0:128]
    distance = np.sqrt((i - centre[0]) ** 2 + (j - centre[1]) ** 2)
    ring = (distance >= 20) & (distance <= 30) & volumes["possible_dose_mask"][:, :, k] & ~targets[:, :, k]
    dose = volumes["dose"][:, :, k]
    on, off = dose[ring & on_path[:, :, k]], dose[ring & ~near_path[:, :, k]]
    assert on.size > 100 and off.size > 100
    assert on.mean() > 10 * off.mean()


@SLOW_FOR_ITS_TIME
def test_a_patient_with_its_own_beams_and_prescriptions_gets_their_dose(tmp_path, seven_fields):
    own = write_prostate_phantom(tmp_path / "own" / "pt_4", seed=4, own_plan=True, site=PROSTATE)
    site = write_prostate_phantom(tmp_path / "site" / "pt_4", seed=4, site=PROSTATE)
    beams, couches = read_beams(own)
    assert beams.gantry_angles() == SEVEN_FIELDS and couches == (0.0,) * 7
    assert read_prescriptions(own, PROSTATE) == OWN_PRESCRIPTIONS_GY
    assert read_beams(site) is None and not (site / "prescriptions.csv").exists()
    for name in ("ct.csv", "possible_dose_mask.csv", *PROSTATE.structure_files()):  # one anatomy, by seed
        assert filecmp.cmp(own / name, site / name, shallow=False), name
    assert not filecmp.cmp(own / "dose.csv", site / "dose.csv", shallow=False)
    volumes = make_prostate_phantom(4, gantry_angles=SEVEN_FIELDS, prescriptions=OWN_PRESCRIPTIONS_GY, site=PROSTATE)
    assert volumes["dose"][volumes["PTV78"]].mean() == pytest.approx(74.0, abs=0.01)
    # the dose of its own plan is that of seven fields: scaled from 78 Gy to 74 Gy near enough
    assert np.abs(volumes["dose"] - seven_fields["dose"] * 74 / 78).max() < 0.15 * 74


def test_phantoms_only_for_the_sites_they_model(tmp_path):
    site = PROSTATE.to_dict()
    site["structures"] = [s for s in site["structures"] if s["name"] != "Bladder"]
    site["goals"] = [goal for goal in site["goals"] if goal["structure"] != "Bladder"]  # a goal names a structure of the site
    site["name"] = "pelvis"
    path = tmp_path / "pelvis.json"
    path.write_text(__import__("json").dumps(site))
    with pytest.raises(PhantomSiteError, match="No phantoms for site pelvis: .*Rectum, Bladder") as caught:
        write_site_phantom(tmp_path / "pt_1", seed=1, site=load_site(path))
    assert "\n" not in str(caught.value) and not (tmp_path / "pt_1").exists()
