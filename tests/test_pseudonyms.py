"""Pseudonyms and splits of ``openkbp-dicom import-cohort``: the identity map, private from its
creation, and the splits that adding patients never changes."""

import os

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
