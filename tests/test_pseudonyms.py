"""Pseudonyms and splits of ``openkbp-dicom import-cohort``: the identity map, private from its
creation, and the splits that adding patients never changes."""

import os

import pytest

from provided_code.dicom.errors import CohortError
from provided_code.dicom.ledger import Ledger
from provided_code.dicom.pseudonyms import IdentityMap, assign_splits, moved_pseudonyms


def test_the_identity_map_is_its_owners_alone_from_its_creation(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "chmod", lambda *args, **kwargs: None)  # a mode set once written does not count
    umask = os.umask(0)  # what the process would give a new file: everyone may read and write it
    try:
        IdentityMap(tmp_path / "identity-map.csv").assign(["PAT-1"])
    finally:
        os.umask(umask)
    assert (tmp_path / "identity-map.csv").stat().st_mode & 0o777 == 0o600



def test_adding_patients_never_moves_one_between_splits(tmp_path):
    for validation in (0.3, 4):
        out = tmp_path / f"v{validation}"
        out.mkdir()
        first = [f"P{k:03d}" for k in range(12)]
        identity, ledger = IdentityMap(out / "identity-map.csv"), Ledger(out)
        identity.assign(first)
        assign_splits(ledger.splits, identity.pseudonyms, first, validation, seed=3)
        before = dict(ledger.splits)
        assert sum(s == "validation" for s in before.values()) == (4 if validation == 4 else
                                                                   sum(s == "validation" for s in before.values()))
        for pseudonym, split in before.items():  # what the run leaves: the journal of its imports
            ledger.record({"pseudonym": pseudonym, "split": split, "status": "imported", "fingerprint": "x"})
        later, later_ledger = IdentityMap(out / "identity-map.csv"), Ledger(out)
        more = first + [f"Q{k:03d}" for k in range(30)]
        later.assign(more)
        assign_splits(later_ledger.splits, later.pseudonyms, more, validation, seed=3)
        assert {p: later_ledger.splits[p] for p in before} == before
        assert {later.pseudonyms[p] for p in first} == set(before)  # the same pseudonyms
        if validation == 4:
            assert sum(s == "validation" for s in later_ledger.splits.values()) == 4


def test_a_pseudonym_whose_patient_now_has_an_id_the_map_lacks_is_named_as_moved(tmp_path):
    identity = IdentityMap(tmp_path / "identity-map.csv")
    identity.assign(["PAT-1", "PAT-2"])
    pseudonym = identity.pseudonyms["PAT-1"]
    text = (tmp_path / "identity-map.csv").read_text()
    (tmp_path / "identity-map.csv").write_text(text.replace("PAT-1", "PAT-9"))  # a typo made by hand
    edited = IdentityMap(tmp_path / "identity-map.csv")
    earlier = {"1.2.3": pseudonym, "1.2.4": identity.pseudonyms["PAT-2"], "1.2.5": pseudonym}  # 1.2.5: gone
    assert moved_pseudonyms(edited, earlier, {"1.2.3": "PAT-1", "1.2.4": "PAT-2"}) == {
        pseudonym: f"{pseudonym} (line {edited.lines['PAT-9']}) was imported from the patient now under a PatientID "
                   f"the map does not have (it would get a new pseudonym)"}
    assert moved_pseudonyms(identity, earlier, {"1.2.3": "PAT-1", "1.2.4": "PAT-2"}) == {}


def test_an_identity_map_in_another_encoding_is_refused_in_one_line_naming_its_line_and_byte(tmp_path):
    path = tmp_path / "identity-map.csv"
    # edited by hand, saved as Latin-1
    path.write_bytes("pseudonym,patient_id,cohort\npt_1,MÜLLER-1,c0\n".encode("latin-1"))
    with pytest.raises(CohortError) as raised:
        IdentityMap(path)
    offset = len(b"pseudonym,patient_id,cohort\npt_1,M")
    assert str(raised.value) == (f"{path}, line 2: not UTF-8 text (byte 0xDC at offset {offset}); save the file as "
                                 f"UTF-8 (a spreadsheet's \"CSV UTF-8\")")


def test_an_identity_map_saved_as_csv_utf8_by_a_spreadsheet_is_read(tmp_path):
    """Excel's "CSV UTF-8" begins the file with a byte-order mark: no part of the header."""
    path = tmp_path / "identity-map.csv"
    path.write_bytes("\ufeffpseudonym,patient_id,cohort\r\npt_1,MÜLLER-1,c0\r\npt_2,P-2,c0\r\n".encode("utf-8"))
    identity = IdentityMap(path)
    assert identity.pseudonyms == {"MÜLLER-1": "pt_1", "P-2": "pt_2"} and identity.cohort == "c0"
    assert identity.lines == {"MÜLLER-1": 2, "P-2": 3}


def test_import_cohort_with_a_map_in_another_encoding_says_one_line(tmp_path):
    from click.testing import CliRunner

    from provided_code.apps.dicom_cli import main

    (tmp_path / "archive").mkdir()
    path = tmp_path / "ids.csv"
    path.write_bytes("pseudonym,patient_id,cohort\npt_1,caf\xe9,c0\n".encode("latin-1"))
    result = CliRunner().invoke(main, ["import-cohort", str(tmp_path / "archive"), "--out", str(tmp_path / "data"),
                                       "--identity-map", str(path)])
    assert result.exit_code == 1
    assert result.output == f"Error: {path}, line 2: not UTF-8 text (byte 0xE9 at offset 36); save the file as UTF-8 " \
                            f"(a spreadsheet's \"CSV UTF-8\")\n"
