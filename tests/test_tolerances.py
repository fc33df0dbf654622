"""The physicist's tolerance file (provided_code/tolerances.py): its format, the defaults, each
refusal naming the file and the entry, and the structure-metrics it judges on a site."""

import pytest

from provided_code.errors import UserError
from provided_code.sites import load_site, openkbp
from provided_code.tolerances import (DEFAULTS, Tolerance, ToleranceError, cells, check_site, describe,
                                      parse_tolerances, read_tolerances)

GOOD = """\ufeffstructure,metric,within_gy,fraction
# the clinic's: the defaults, and tighter for the high-dose target
organs,Dmean,3,0.9

targets,D95,3,0.9
PTV70,D95,2,0.95
SpinalCord,D_0.1_cc,4,1
"""


def test_a_file_is_read_in_its_order_with_its_lines(tmp_path):
    path = tmp_path / "tolerances.csv"
    path.write_text(GOOD, encoding="utf-8")
    assert read_tolerances(path) == (Tolerance("organs", "Dmean", 3.0, 0.9, 3), Tolerance("targets", "D95", 3.0, 0.9, 5),
                                     Tolerance("PTV70", "D95", 2.0, 0.95, 6),
                                     Tolerance("SpinalCord", "D_0.1_cc", 4.0, 1.0, 7))


def test_the_defaults_are_each_organs_mean_and_each_targets_d95_within_3_gy_for_90_percent():
    assert [t.to_dict() for t in DEFAULTS] == [
        {"structure": "organs", "metric": "Dmean", "within_gy": 3.0, "fraction": 0.9},
        {"structure": "targets", "metric": "D95", "within_gy": 3.0, "fraction": 0.9}]
    assert describe() == ("each organ's Dmean within 3 Gy of the plan for 90 % of patients; each target's D95 within "
                          "3 Gy of the plan for 90 % of patients")
    site = openkbp()
    assert [(s, m) for s, m, _ in cells(DEFAULTS, site)] == [
        *[(name, "Dmean") for name in site.oars], *[(name, "D95") for name in site.targets]]


def test_a_structures_own_row_takes_the_place_of_its_kinds_row():
    site = openkbp()
    found = {(s, m): t for s, m, t in cells(parse_tolerances(GOOD), site)}
    assert found[("PTV70", "D95")].within_gy == 2.0 and found[("PTV63", "D95")].within_gy == 3.0
    assert found[("SpinalCord", "D_0.1_cc")].fraction == 1.0 and ("Brainstem", "D_0.1_cc") not in found
    assert len(found) == len(site.names) + 1


@pytest.mark.parametrize("text, entry, expected", [
    ("structure,metric,within_gy,fraction\nPTV70,D95,-1,0.9\n", "line 2: 'PTV70,D95,-1,0.9'", "within_gy a tolerance in Gy, 0 or more"),
    ("structure,metric,within_gy,fraction\nPTV70,D95,3 Gy,0.9\n", "line 2: 'PTV70,D95,3 Gy,0.9'", "within_gy a tolerance in Gy"),
    ("structure,metric,within_gy,fraction\n\nPTV70,D95,3,0\n", "line 3: 'PTV70,D95,3,0'", r"fraction a share of the patients in \(0, 1\]"),
    ("structure,metric,within_gy,fraction\nPTV70,D95,3,90\n", "line 2: 'PTV70,D95,3,90'", r"fraction a share of the patients in \(0, 1\]"),
    ("structure,metric,within_gy,fraction\nPTV70,D95,3,nan\n", "line 2: 'PTV70,D95,3,nan'", r"fraction a share"),
    ("structure,metric,within_gy,fraction\nPTV70,D95,3\n", "line 2: 'PTV70,D95,3'", "4 cells"),
    ("structure,metric,within_gy,fraction\n,D95,3,0.9\n", "line 2: ',D95,3,0.9'", "a structure and a metric"),
    ("structure,metric,within_gy,fraction\nPTV70,D95,3,0.9\nPTV70,D95,2,0.9\n",
     "line 3: 'PTV70,D95,2,0.9', as on line 2", "each structure-metric once"),
    ("structure,metric,tolerance\nPTV70,D95,3\n", "line 1: 'structure,metric,tolerance'", "the header structure,metric"),
    ("", "an empty file", "the header"),
    ("structure,metric,within_gy,fraction\n", "line 1: none", "at least one tolerance"),
])
def test_a_bad_entry_is_refused_naming_the_file_and_the_entry(tmp_path, text, entry, expected):
    path = tmp_path / "tolerances.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ToleranceError, match=rf"^Invalid `tolerances`\. Expected {expected}.*\. Received: ") as caught:
        read_tolerances(path)
    message = str(caught.value)
    assert f"Received: {path}" in message and entry in message and "\n" not in message
    assert isinstance(caught.value, UserError)


@pytest.mark.parametrize("row, expected, received", [
    ("Parotid_L,Dmean,3,0.9", r"a structure of site openkbp \(Brainstem, ", "line 2: unknown structure 'Parotid_L'"),
    ("PTV70,D96,3,0.9", r"a DVH metric \(D_0.1_cc, mean, D_99, D_95, D_1, D99, D95, D50, Dmean, D1, Dmax\)",
     "line 2: unknown metric 'D96'"),
    ("Brainstem,D_95,3,0.9", r"a DVH metric of Brainstem \(an organ at risk\) on site openkbp \(D_0.1_cc, mean, D99, "
                             r"D95, D50, Dmean, D1, Dmax\)",
     "line 2: 'D_95' for Brainstem, a metric the site does not compute for organs at risk"),
    ("targets,mean,3,0.9", r"a DVH metric of targets on site openkbp \(D_99, D_95, D_1, D99, ",
     "line 2: 'mean' for targets, a metric the site does not compute for targets"),
])
def test_a_structure_or_metric_the_site_does_not_have_is_refused_naming_the_entry(row, expected, received):
    tolerances = parse_tolerances(f"structure,metric,within_gy,fraction\n{row}\n", "my-tolerances.csv")
    with pytest.raises(ToleranceError, match=rf"^Invalid `tolerances`\. Expected {expected}") as caught:
        check_site(tolerances, openkbp(), "my-tolerances.csv")
    assert f"Received: my-tolerances.csv, {received}" in str(caught.value)


def test_a_file_that_is_missing_or_a_folder_is_refused_naming_it(tmp_path):
    with pytest.raises(ToleranceError, match=rf"Received: {tmp_path / 'none.csv'}: no such file"):
        read_tolerances(tmp_path / "none.csv")
    with pytest.raises(ToleranceError, match=rf"Received: {tmp_path}: a folder"):
        read_tolerances(tmp_path)


def test_the_defaults_hold_on_every_shipped_site():
    for name in ("openkbp", "prostate"):
        site = load_site(name)
        check_site(DEFAULTS, site)
        assert len(cells(DEFAULTS, site)) == len(site.names)
