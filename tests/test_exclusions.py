"""The exclusion list (--exclude FILE): patient,reason rows, each refused in one line naming the file and line."""

import pytest

from provided_code.exclusions import ExclusionError, read_exclusions, split_patients


def test_an_exclusion_list_is_read_in_its_order_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "exclude.csv"
    path.write_text('\ufeffpatient,reason\npt_7,"parotid spared far less than predicted, replan"\n\npt_2,contour\n')
    assert read_exclusions(path) == ({"patient": "pt_7", "reason": "parotid spared far less than predicted, replan"},
                                     {"patient": "pt_2", "reason": "contour"})


@pytest.mark.parametrize("text, problem", [
    ("id,why\npt_1,x\n", "line 1: the header must be patient,reason"),
    ("patient,reason\npt_1\n", "line 2: expected a patient and a reason"),
    ("patient,reason\npt_1,\n", "line 2: expected a patient and a reason"),
    ("patient,reason\npt_1,a\npt_1,b\n", "line 3: pt_1 is listed twice"),
    ("", "line 1: the header must be patient,reason; found 'an empty file'"),
])
def test_a_malformed_list_is_refused_naming_the_file_and_line(tmp_path, text, problem):
    path = tmp_path / "exclude.csv"
    path.write_text(text)
    with pytest.raises(ExclusionError, match=f"^{path}: {problem}"):
        read_exclusions(path)


def test_the_split_holds_the_excluded_whose_files_were_not_read_and_not_others_skipped():
    skipped = {"pt_9": "dose.csv: 3 voxels outside the mask", "pt_4": "ct.csv: missing"}
    assert split_patients(["pt_1", "pt_2"], skipped, {"pt_9", "pt_2"}) == ["pt_1", "pt_2", "pt_9"]
