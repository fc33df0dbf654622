"""Sites as data: the shipped files, and one line naming the file and the field for a bad one."""

import json
import re

import numpy as np
import pytest

from provided_code.data.cache import cache_path_for
from provided_code.sites import (HERE, MAX_METRIC_CC, MAX_STRUCTURES, SHIPPED, Arc, Goal, SiteError, load_site, openkbp,
                                 parse_metric, site_from_dict)
from tests.kit.repo import REPO


def _write(tmp_path, site: dict):
    path = tmp_path / "site.json"
    path.write_text(json.dumps(site))
    return path


def _minimal() -> dict:
    return {"name": "lung", "structures": [
        {"name": "Heart", "kind": "oar", "dicom_names": ["Heart"]},
        {"name": "LungR", "kind": "oar"}, {"name": "LungL", "kind": "oar"},
        {"name": "PTV60", "kind": "target", "prescription_gy": 60}],
        "mirror_pairs": [["LungR", "LungL"]], "beams": {"type": "static", "angles": [0, 180]}}


def test_openkbp_is_the_challenge_as_before():
    site = openkbp()
    assert site.names == ("Brainstem", "SpinalCord", "RightParotid", "LeftParotid", "Esophagus", "Larynx", "Mandible",
                          "PTV56", "PTV63", "PTV70")
    assert site.prescriptions_gy == {"PTV56": 56.0, "PTV63": 63.0, "PTV70": 70.0}
    assert site.mirror_bits == ((1 << 2, 1 << 3),) and site.mask_dtype == np.uint16
    assert site.target_bits == 0b1110000000
    assert site.beams.gantry_angles() == tuple(float(40 * k) for k in range(9))
    assert site.metric_names == ("D_0.1_cc", "mean", "D_99", "D_95", "D_1")


def test_a_site_says_which_targets_a_patient_may_lack(tmp_path):
    assert openkbp().required_targets == ("PTV70",)  # head and neck: one, two or three dose levels, PTV70 always
    assert load_site("prostate").required_targets == ("PTV60", "PTV78")  # the protocol's two levels, both always
    assert load_site(_write(tmp_path, _minimal())).required_targets == ("PTV60",)  # a file without the field: all
    before = openkbp().to_dict()  # a model's or a cache's site written before the field: the same site
    for entry in before["structures"]:
        entry.pop("required", None)
    assert site_from_dict(before, "config.json").required_targets == openkbp().targets
    assert site_from_dict(before, "config.json").same_as(openkbp())
    for entry, problem in (({"required": "no"}, r"structures\[3\].required`: expected true or false"),
                           ({"required": False}, r"`structures`: every target is optional")):
        site = _minimal()
        site["structures"][3].update(entry)
        with pytest.raises(SiteError, match=problem):
            load_site(_write(tmp_path, site))
    site = _minimal()
    site["structures"][0]["required"] = True
    with pytest.raises(SiteError, match=r"structures\[0\].required`: organ at risk 'Heart': only a target"):
        load_site(_write(tmp_path, site))


def test_a_metric_name_is_read_by_one_grammar():
    assert [parse_metric(name) for name in openkbp().metric_names] == [
        ("cc", 0.1), ("mean", 0.0), ("percent", 99.0), ("percent", 95.0), ("percent", 1.0)]
    for bad in ("D_", "D_x", "max", "D_95_gy", None):
        with pytest.raises(ValueError, match="Invalid metric"):
            parse_metric(bad)


def test_a_site_round_trips_through_its_dictionary():
    for name in ("openkbp", "prostate"):
        site = load_site(name)
        assert site_from_dict(json.loads(json.dumps(site.to_dict())), "x") == site


def test_a_site_file_loads_by_path(tmp_path):
    site = load_site(_write(tmp_path, _minimal()))
    assert site.name == "lung" and site.targets == ("PTV60",) and site.mirror_pairs == (("LungR", "LungL"),)
    assert site.structures[1].dicom_names == ("LungR",)  # the structure's own name by default


def test_a_metric_of_up_to_the_largest_volume_a_structure_may_hold_is_accepted(tmp_path):
    site = _minimal()
    site["metrics"] = {"oar": ["D_2_cc", f"D_{MAX_METRIC_CC:g}_cc"], "target": ["D_95"]}
    assert load_site(_write(tmp_path, site)).metric_names == ("D_2_cc", "D_10000_cc", "D_95")


def test_the_prostate_site_has_two_dose_levels_and_arcs():
    site = load_site("prostate")
    assert site.prescriptions_gy == {"PTV60": 60.0, "PTV78": 78.0}
    assert site.mirror_pairs == (("FemoralHead_R", "FemoralHead_L"),)
    angles = site.beams.gantry_angles()
    assert len(angles) == 35 and 180.0 not in angles  # two arcs around the couch at 180°, every 10°


def test_an_arc_is_sampled_at_the_multiples_of_the_step_in_its_direction():
    assert Arc(350, 30, "CW").angles() == (350.0, 0.0, 10.0, 20.0, 30.0)
    assert Arc(35, 355, "CC").angles() == (30.0, 20.0, 10.0, 0.0)
    assert len(Arc(90, 90, "CW").angles()) == 36  # a start equal to its stop is a full turn


def test_more_than_sixteen_structures_pack_into_uint32(tmp_path):
    site = _minimal()
    site["structures"] = [{"name": f"OAR{k}", "kind": "oar"} for k in range(MAX_STRUCTURES - 1)] + \
                         [{"name": "PTV", "kind": "target", "prescription_gy": 50}]
    site["mirror_pairs"] = []
    assert load_site(_write(tmp_path, site)).mask_dtype == np.uint32


@pytest.mark.parametrize("change, field", [
    (lambda s: s["structures"][0].update(kind="organ"), "structures[0].kind"),
    (lambda s: s["structures"].append({"name": "Heart", "kind": "oar"}), "structures[4].name"),
    (lambda s: s["structures"][3].pop("prescription_gy"), "structures[3].prescription_gy"),
    (lambda s: s.update(mirror_pairs=[["LungR", "Liver"]]), "mirror_pairs[0]"),
    (lambda s: s.update(structures=[{"name": f"S{k}", "kind": "target", "prescription_gy": 1}
                                    for k in range(MAX_STRUCTURES + 1)]), "structures"),
    (lambda s: s.pop("name"), "name"),
    (lambda s: s["structures"][1].pop("kind"), "structures[1].kind"),
    (lambda s: s.update(metrics={"oar": ["D_2_cc"], "target": ["V95"]}), "metrics.target"),
    (lambda s: s.update(beams={"type": "arcs", "arcs": [{"start": 0, "stop": 10, "direction": "CWW"}]}),
     "beams.arcs[0].direction"),
    (lambda s: s.update(grid={"shape": [64, 64, 64]}), "grid.shape"),
    (lambda s: s.update(colour="red"), "colour"),
])
def test_a_bad_site_file_is_one_line_naming_the_file_and_the_field(tmp_path, change, field):
    site = _minimal()
    change(site)
    path = _write(tmp_path, site)
    with pytest.raises(SiteError) as caught:
        load_site(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and f"`{field}`" in message


@pytest.mark.parametrize("name", ["dose", "ct", "possible_dose_mask", "prescriptions", "beams", "voxel_dimensions",
                                  "Dose"])
def test_a_structure_named_after_a_file_of_the_patient_folder_is_refused(tmp_path, name):
    site = _minimal()
    site["structures"][0]["name"] = name
    site["mirror_pairs"] = []
    path = _write(tmp_path, site)
    with pytest.raises(SiteError, match=rf"`structures\[0\]\.name`: '{name}' would be stored as {name.lower()}\.csv, "
                                        r"a file every patient folder has") as caught:
        load_site(path)
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize("pair, problem", [
    (["PTV60", "PTV54"], "'PTV60' (a target of 60 Gy) and 'PTV54' (a target of 54 Gy)"),
    (["LungR", "PTV60"], "'LungR' (an organ at risk) and 'PTV60' (a target of 60 Gy)"),
    (["PTV54", "Heart"], "'PTV54' (a target of 54 Gy) and 'Heart' (an organ at risk)"),
])
def test_a_mirror_pair_is_two_organs_or_two_targets_of_one_prescription(tmp_path, pair, problem):
    site = _minimal()
    site["structures"].append({"name": "PTV54", "kind": "target", "prescription_gy": 54})
    site["mirror_pairs"] = [pair]
    path = _write(tmp_path, site)
    with pytest.raises(SiteError, match=re.escape(f"`mirror_pairs[0]`: {problem}: a left-right flip swaps the two")):
        load_site(path)
    site["structures"][-1]["prescription_gy"] = 60  # two targets of one prescription: a pair
    site["mirror_pairs"] = [["PTV60", "PTV54"]]
    assert load_site(_write(tmp_path, site)).mirror_pairs == (("PTV60", "PTV54"),)


def test_an_unknown_site_name_or_a_missing_file_is_refused(tmp_path):
    with pytest.raises(SiteError, match="openkbp, prostate or a site file"):
        load_site("lung")
    with pytest.raises(SiteError, match="does not exist"):
        load_site(tmp_path / "nowhere.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SiteError, match="not a JSON file"):
        load_site(tmp_path / "bad.json")


def test_the_sites_pages_complete_example_is_the_shipped_prostate_file():
    page = (REPO / "docs" / "sites.md").read_text()
    block = re.search(r'```json\n(\{\n  "format": 1,\n  "name": "prostate".*?\n\})\n```', page, re.S)
    assert block is not None, "docs/sites.md lost the prostate site's example"
    assert json.loads(block.group(1)) == json.loads((HERE / "prostate.json").read_text())


def test_a_site_file_under_a_shipped_name_must_be_that_site(tmp_path):
    site = load_site("prostate").to_dict()
    site["structures"][-1]["prescription_gy"] = 74
    with pytest.raises(SiteError, match=r"`name`: 'prostate' is a shipped site's name"):
        load_site(_write(tmp_path, site))
    site["name"] = "prostate74"
    assert load_site(_write(tmp_path, site)).prescriptions_gy["PTV78"] == 74.0


@pytest.mark.parametrize("change, field, problem", [
    (lambda s: s.pop("beams"), "beams", 'missing (say {"type": "none"}'),
    (lambda s: s["structures"][1].update(dicom_names=["heart"]), "dicom_names", "'heart' matches both Heart and LungR"),
    (lambda s: s.update(mirror_pairs=[["LungR", "LungR"]]), "mirror_pairs[0]", "a structure cannot mirror itself"),
    (lambda s: s["structures"][3].update(prescription_gy=7000), "structures[3].prescription_gy",
     "expected at most 150 Gy (MAX_DOSE_GY; a dose in cGy?). Received: 7000"),
    (lambda s: s.update(beams={"type": "static", "angles": [0, 361]}), "beams.angles",
     "expected gantry angles in [0, 360) degrees. Received: 361"),
    (lambda s: s.update(beams={"type": "arcs", "arcs": [{"start": 400, "stop": 10, "direction": "CW"}]}),
     "beams.arcs[0].start", "expected a gantry angle in [0, 360) degrees. Received: 400"),
    (lambda s: s.update(beams={"type": "arcs", "arcs": [{"start": -10, "stop": 10, "direction": "CW"}]}),
     "beams.arcs[0].start", "expected a gantry angle in [0, 360) degrees. Received: -10"),
    (lambda s: s.update(beams={"type": "arcs", "arcs": [{"start": 0, "stop": 720, "direction": "CW"}]}),
     "beams.arcs[0].stop", "expected a gantry angle in [0, 360) degrees. Received: 720"),
    (lambda s: s.update(metrics={"oar": ["D_100000_cc", "mean"], "target": ["D_95"]}), "metrics.oar",
     "'D_100000_cc': 100000 cc is more than any structure holds (at most 10000 cc, MAX_METRIC_CC)"),
])
def test_what_a_site_must_say_and_what_cannot_be(tmp_path, change, field, problem):
    site = _minimal()
    change(site)
    with pytest.raises(SiteError, match=re.escape(f"`{field}`: {problem}")):
        load_site(_write(tmp_path, site))



def test_the_shipped_sites_goals_are_read_and_a_site_without_goals_writes_none(tmp_path):
    site = openkbp()
    assert Goal("SpinalCord", "D_0.1_cc", max_gy=45.0) in site.goals and Goal("PTV70", "D_95", min_gy=66.5) in site.goals
    assert site.to_dict()["goals"][0] == {"structure": "Brainstem", "metric": "D_0.1_cc", "max_gy": 54}
    assert str(site.goals[0]) == "Brainstem D_0.1_cc ≤ 54 Gy"
    assert Goal("Rectum", "D50", max_gy=50.0) in load_site("prostate").goals  # a clinical metric
    lung = load_site(_write(tmp_path, _minimal()))
    assert lung.goals == () and "goals" not in lung.to_dict()


def test_goals_are_not_part_of_what_a_model_or_a_cache_is(tmp_path):
    """A model's config.json or a cache saved before goals existed holds its site without them: it
    is still of the shipped site (read as today's shipped site, so an older model is commissioned
    against today's goals), and the cache keeps its name."""
    for name in SHIPPED:
        shipped = load_site(name)
        saved = shipped.to_dict()
        del saved["goals"]
        before_goals = site_from_dict(saved, "config.json")  # the site as saved, goals absent
        assert before_goals.goals == () and shipped.goals
        assert before_goals.same_as(shipped) and shipped.same_as(before_goals)
        assert load_site(saved) is shipped  # as a model's config.json `site` is read: today's shipped site
        assert cache_path_for(tmp_path, tmp_path / "c", site=before_goals) == cache_path_for(tmp_path, tmp_path / "c",
                                                                             site=shipped)
    other_goals = load_site("prostate").to_dict()
    other_goals["goals"] = [{"structure": "Rectum", "metric": "mean", "max_gy": 40}]
    site = load_site(_write(tmp_path, other_goals))  # a shipped name with goals of one's own: the same site
    assert site.same_as(load_site("prostate")) and site.goals == (Goal("Rectum", "mean", max_gy=40.0),)


@pytest.mark.parametrize("goal, field, problem", [
    ({"structure": "Lung", "metric": "mean", "max_gy": 20}, "goals[0].structure", "unknown structure 'Lung'"),
    ({"structure": "Heart", "metric": "D_95", "max_gy": 20}, "goals[0].metric", "unknown metric 'D_95' for oar Heart"),
    ({"structure": "PTV60", "metric": "V20", "min_gy": 57}, "goals[0].metric", "unknown metric 'V20'"),
    ({"structure": "Heart", "metric": "mean", "max_gy": 20, "min_gy": 1}, "goals[0]", "max_gy and min_gy"),
    ({"structure": "Heart", "metric": "mean"}, "goals[0]", "Received: neither"),
    ({"structure": "Heart", "metric": "Dmean", "max_gy": -1}, "goals[0].max_gy", "0 or more. Received: -1"),
    ({"structure": "Heart", "metric": "mean", "max_gy": "20"}, "goals[0].max_gy", "Received: '20'"),
    ({"structure": "Heart", "metric": "mean", "max_gy": float("inf")}, "goals[0].max_gy", "Received: inf"),
    ({"structure": "Heart", "metric": "mean", "max_gy": 20, "volume": 1}, "goals[0].volume", "unknown field"),
])
def test_a_bad_goal_is_one_line_naming_the_file_and_the_field(tmp_path, goal, field, problem):
    site = _minimal()
    site["goals"] = [goal]
    path = _write(tmp_path, site)
    with pytest.raises(SiteError) as caught:
        load_site(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and f"`{field}`" in message and problem in message


def test_a_sites_plausible_dose_ceiling_is_its_file_setting_or_1_3_times_its_highest_prescription(tmp_path):
    assert openkbp().dose_ceiling_gy == pytest.approx(91.0) and load_site("prostate").dose_ceiling_gy == \
        pytest.approx(101.4)
    assert "dose_ceiling_gy" not in openkbp().to_dict()  # the default is written nowhere
    lung = _minimal()
    lung["dose_ceiling_gy"] = 75
    site = load_site(_write(tmp_path, lung))
    assert site.dose_ceiling_gy == 75.0 and site.to_dict()["dose_ceiling_gy"] == 75
    assert site.dose_ceiling_said == "the site lung's dose_ceiling_gy"
    assert site.same_as(load_site(_write(tmp_path, _minimal())))  # a judgement of predictions, not part of a model


@pytest.mark.parametrize("ceiling, problem", [
    (60, "expected more than the highest prescription (60 Gy) and at most 300 Gy (a dose in cGy?). Received: 60"),
    (7800, "Received: 7800"), ("90", "expected a number of Gy. Received: '90'"), (float("nan"), "Received: nan")])
def test_a_dose_ceiling_at_or_below_the_prescription_or_in_cgy_is_refused(tmp_path, ceiling, problem):
    site = _minimal()
    site["dose_ceiling_gy"] = ceiling
    path = _write(tmp_path, site)
    with pytest.raises(SiteError) as caught:
        load_site(path)
    assert str(caught.value).startswith(f"{path}: invalid `dose_ceiling_gy`: ") and problem in str(caught.value)
