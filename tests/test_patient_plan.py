"""A patient's own prescriptions.csv and beams.csv: read, written, checked, and carried into the cache."""

import logging
import shutil

import numpy as np
import pytest

from provided_code.data.cache import cache_path_for, load_split
from provided_code.data.csv_io import PatientDataError, read_patient
from provided_code.data.patient_plan import (
    read_beams,
    read_plan,
    read_prescriptions,
    write_beams,
    write_prescriptions,
)
from provided_code.sites import Beams, load_site, openkbp


def test_prescriptions_override_the_sites_for_the_targets_they_list(tmp_path):
    write_prescriptions(tmp_path, {"PTV70": 66.0})
    assert read_prescriptions(tmp_path, openkbp()) == {"PTV56": 56.0, "PTV63": 63.0, "PTV70": 66.0}
    assert read_prescriptions(tmp_path / "none", openkbp()) == openkbp().prescriptions_gy


def test_beams_round_trip_static_and_arcs(tmp_path):
    write_beams(tmp_path, [{"type": "static", "gantry_start": 30.0, "couch": 0},
                           {"type": "static", "gantry_start": 330.0, "couch": 10.0}])
    beams, couches = read_beams(tmp_path)
    assert beams.gantry_angles() == (30.0, 330.0) and couches == (0.0, 10.0)
    write_beams(tmp_path, [{"type": "arc", "gantry_start": 181.0, "gantry_stop": 179.0, "direction": "CW"},
                           {"type": "arc", "gantry_start": 179.0, "gantry_stop": 181.0, "direction": "CC"}])
    assert read_plan(tmp_path, openkbp())[1] == load_site("prostate").beams.gantry_angles()
    write_beams(tmp_path, [{"type": "static", "gantry_start": 5.0},
                           {"type": "arc", "gantry_start": 0.0, "gantry_stop": 20.0, "direction": "CW"}])
    assert read_beams(tmp_path)[0] == Beams("static", angles=(5.0, 0.0, 10.0, 20.0))  # mixed: static, as documented


def test_a_patients_plan_is_what_its_files_say_and_none_without_them(tmp_path):
    assert read_plan(tmp_path, openkbp()) == (None, None)
    write_prescriptions(tmp_path, {"PTV70": 66.0})
    assert read_plan(tmp_path, openkbp()) == ({"PTV56": 56.0, "PTV63": 63.0, "PTV70": 66.0}, None)
    write_beams(tmp_path, [{"type": "static", "gantry_start": a} for a in (0.0, 90.0)])
    assert read_plan(tmp_path, openkbp())[1] == (0.0, 90.0)


@pytest.mark.parametrize("text, problem", [
    ("structure,dose_gy\nPTV99,70\n", "not a target of site openkbp"),
    ("structure,dose_gy\nPTV70,-1\n", "must be positive"),
    ("structure,dose_gy\nPTV70,abc\n", "not a finite number"),
    ("name,gy\nPTV70,70\n", "header must be structure,dose_gy"),
    ("structure,dose_gy\nPTV70,70\nPTV70,71\n", "listed twice"),
    ("structure,dose_gy\nPTV70,6600\n", r"line 2: dose_gy 6600 is above 150 Gy \(MAX_DOSE_GY\): a dose in cGy\?"),
    ("structure,dose_gy\nPTV70,70,56\n", r"line 2 has 3 fields; expected 2 \(structure,dose_gy\)"),
    ("structure,dose_gy\nPTV70\n", r"line 2 has 1 fields; expected 2"),
])
def test_a_bad_prescriptions_file_names_the_patient_the_file_and_the_line(tmp_path, text, problem):
    folder = tmp_path / "pt_7"
    folder.mkdir()
    (folder / "prescriptions.csv").write_text(text)
    with pytest.raises(PatientDataError, match=problem) as caught:
        read_prescriptions(folder, openkbp())
    assert "pt_7" in str(caught.value) and "prescriptions.csv" in str(caught.value)


def test_a_bad_beams_file_names_the_line(tmp_path):
    folder = tmp_path / "pt_3"
    folder.mkdir()
    (folder / "beams.csv").write_text("type,gantry_start,gantry_stop,direction,couch\narc,0,90,left,0\n")
    with pytest.raises(PatientDataError, match="pt_3.*line 2: direction must be CW or CC"):
        read_beams(folder)


@pytest.mark.parametrize("row, problem", [
    ("static,361,,,0", "line 2: gantry_start 361 is not a gantry angle in [0, 360) degrees"),
    ("static,-10,,,0", "line 2: gantry_start -10 is not a gantry angle in [0, 360) degrees"),
    ("arc,0,720,CW,0", "line 2: gantry_stop 720 is not a gantry angle in [0, 360) degrees"),
    ("static,0,,,360", "line 2: couch 360 is not a gantry angle in [0, 360) degrees"),
    ("static,0,,,0,90", "line 2 has 6 fields; expected 5 (type,gantry_start,gantry_stop,direction,couch)"),
])
def test_an_angle_outside_a_turn_or_a_row_of_other_fields_is_refused_naming_the_line(tmp_path, row, problem):
    folder = tmp_path / "pt_5"
    folder.mkdir()
    (folder / "beams.csv").write_text(f"type,gantry_start,gantry_stop,direction,couch\n{row}\n")
    with pytest.raises(PatientDataError) as caught:
        read_beams(folder)
    assert str(caught.value) == f"Patient pt_5: {folder / 'beams.csv'}: {problem}"


def test_a_byte_order_mark_before_the_header_is_accepted(tmp_path):
    (tmp_path / "prescriptions.csv").write_text("\ufeffstructure,dose_gy\nPTV70,66\n", encoding="utf-8")
    (tmp_path / "beams.csv").write_text("\ufefftype,gantry_start,gantry_stop,direction,couch\nstatic,30,,,0\n",
                                        encoding="utf-8")
    assert read_plan(tmp_path, openkbp()) == ({"PTV56": 56.0, "PTV63": 63.0, "PTV70": 66.0}, (30.0,))


def test_an_angle_written_just_under_a_turn_reads_back(tmp_path):
    write_beams(tmp_path, [{"type": "static", "gantry_start": 359.9999999, "couch": 0.0}])
    assert read_beams(tmp_path)[0].gantry_angles() == (0.0,)


def test_a_patient_with_as_many_beams_as_a_run_is_warned_about_gets_that_warning(phantom_split, tmp_path, caplog):
    """40 beams in a patient's beams.csv: the warning 40 run-wide beams (--beam-angles) get."""
    write_beams(phantom_split / "pt_2", [{"type": "static", "gantry_start": 9.0 * k} for k in range(40)])
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=tmp_path / "cache", site=openkbp())
    assert np.count_nonzero(~np.isnan(arrays.beam_angles[1])) == 40
    warnings = [r.getMessage() for r in caplog.records if "beams.csv" in r.getMessage()]
    assert len(warnings) == 1 and "pt_2" in warnings[0] and str(phantom_split / "pt_2" / "beams.csv") in warnings[0]
    assert "40 beams: more than 36 make the first layer slow" in warnings[0]


def test_the_cache_carries_only_what_the_patients_files_say(phantom_split, tmp_path):
    """A patient with prescriptions.csv: read_prescriptions' values (a target it does not list keeps
    the site's); a patient without a file: a row of NaN (the model's default is given later, in
    one place: data.batches.patient_vectors)."""
    split = phantom_split
    write_prescriptions(split / "pt_2", {"PTV70": 66.0})
    write_beams(split / "pt_3", [{"type": "static", "gantry_start": a} for a in (0.0, 90.0, 270.0)])
    arrays = load_split(split, cache_dir=tmp_path / "cache", site=openkbp())
    np.testing.assert_array_equal(arrays.prescriptions, [[np.nan] * 3, [56, 63, 66], [np.nan] * 3])
    np.testing.assert_array_equal(arrays.beam_angles, [[np.nan] * 3, [np.nan] * 3, [0, 90, 270]])
    again = load_split(split, cache_dir=tmp_path / "cache", site=openkbp())  # from the cache file this time
    assert np.array_equal(again.prescriptions, arrays.prescriptions, equal_nan=True)
    assert np.array_equal(again.beam_angles, arrays.beam_angles, equal_nan=True)


def test_a_split_without_plan_files_has_no_plan_tables(phantom_data, tmp_path):
    arrays = load_split(phantom_data / "train-pats", cache_dir=tmp_path / "cache", site=openkbp())
    assert arrays.prescriptions is None and arrays.beam_angles is None


def test_each_site_keeps_its_cache_and_one_recording_another_site_is_rebuilt_saying_why(phantom_data, tmp_path,
                                                                                        caplog):
    split = tmp_path / "train-pats"
    shutil.copytree(phantom_data / "train-pats" / "pt_1", split / "pt_1")
    for name in ("Brainstem", "SpinalCord", "RightParotid", "LeftParotid", "Esophagus", "Larynx", "Mandible"):
        (split / "pt_1" / f"{name}.csv").unlink(missing_ok=True)
    site = load_site(_targets_only(tmp_path))  # the targets alone: a site of its own
    load_split(split, cache_dir=tmp_path / "cache", site=openkbp())
    arrays = load_split(split, cache_dir=tmp_path / "cache", site=site)
    assert arrays.site.name == "targets" and arrays.structure_present.shape == (1, 3)
    openkbp_cache = cache_path_for(split, tmp_path / "cache", site=openkbp())
    site_cache = cache_path_for(split, tmp_path / "cache", site=site)
    assert openkbp_cache != site_cache and openkbp_cache.is_file() and site_cache.is_file()  # no rebuilds in turn
    shutil.copy(openkbp_cache, site_cache)  # a cache file that records another site
    with caplog.at_level(logging.WARNING):
        assert load_split(split, cache_dir=tmp_path / "cache", site=site).site.name == "targets"
    assert any("built for site openkbp, this run's site is targets" in r.getMessage() for r in caplog.records)


def _targets_only(folder):
    path = folder / "hn.json"
    path.write_text('{"name": "targets", "structures": [{"name": "PTV56", "kind": "target", "prescription_gy": 56},'
                    '{"name": "PTV63", "kind": "target", "prescription_gy": 63},'
                    '{"name": "PTV70", "kind": "target", "prescription_gy": 70}], "beams": {"type": "none"}}')
    return path


def test_a_structure_file_the_site_does_not_have_is_refused_in_one_line(phantom_data):
    with pytest.raises(PatientDataError) as caught:
        read_patient(phantom_data / "train-pats" / "pt_1", site=load_site("prostate"))
    message = str(caught.value)
    assert "\n" not in message and "pt_1" in message and "not a structure of site prostate" in message


def test_a_cache_written_before_sites_loads_as_openkbps_without_a_rebuild(phantom_data, tmp_path, caplog):
    import h5py

    split = phantom_data / "train-pats"
    # a cache file of this test's own: changed in place below
    load_split(split, cache_dir=tmp_path / "cache", site=openkbp())
    path = cache_path_for(split, tmp_path / "cache", site=openkbp())
    with h5py.File(path, "r+") as h5:
        del h5.attrs["site"]  # as the caches of the previous version were written
    built = path.stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        arrays = load_split(split, cache_dir=tmp_path / "cache", site=openkbp())
    assert arrays.site.same_as(openkbp()) and path.stat().st_mtime_ns == built
    assert not any("Rebuilding" in r.getMessage() for r in caplog.records)
