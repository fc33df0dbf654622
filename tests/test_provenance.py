"""What a fold records it trained on (provided_code/data/provenance.py): its training patients'
files by SHA-256, version by version as resumes read them, and the comparisons commissioning makes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from provided_code.data.provenance import (ProvenanceError, digest, disagreement, differing_files, read_training,
                                           record_training)
from provided_code.errors import UserError


class _Read:
    """What record_training asks of a split's arrays: its folder and each patient's files."""

    def __init__(self, folder, sources):
        self.folder, self._sources = Path(folder), sources

    def sources_of(self):
        return self._sources


A = {"pt_1": {"ct.csv": "a" * 64, "dose.csv": "b" * 64}, "pt_2": {"ct.csv": "c" * 64, "dose.csv": "d" * 64}}
HALVED = {**A, "pt_2": {**A["pt_2"], "dose.csv": "e" * 64}}  # pt_2's plan replaced


def test_a_fold_records_its_patients_files_once_and_a_resume_on_the_same_files_adds_nothing(tmp_path):
    path = tmp_path / "models" / "trained_on.json"
    record_training(path, _Read(tmp_path / "train-pats", A), first_epoch=1)
    written = path.read_bytes()
    record_training(path, _Read(tmp_path / "train-pats", A), first_epoch=4)
    assert path.read_bytes() == written
    assert read_training(path) == [{"from_epoch": 1, "split": str((tmp_path / "train-pats").resolve()),
                                    "patients": A}]


def test_a_resume_on_other_files_adds_a_version_from_the_epoch_it_trains_first(tmp_path):
    path = tmp_path / "trained_on.json"
    record_training(path, _Read(tmp_path, A), first_epoch=1)
    record_training(path, _Read(tmp_path, HALVED), first_epoch=6)
    assert [(version["from_epoch"], version["patients"]) for version in read_training(path)] == [(1, A), (6, HALVED)]


def test_a_version_whose_epochs_are_trained_again_is_dropped(tmp_path):
    """Resumed from epoch 3 (its checkpoints after it lost): the version from epoch 6 trained no
    weight that is kept, and the one from epoch 4 on takes its place."""
    path = tmp_path / "trained_on.json"
    record_training(path, _Read(tmp_path, A), first_epoch=1)
    record_training(path, _Read(tmp_path, HALVED), first_epoch=6)
    record_training(path, _Read(tmp_path, A), first_epoch=4)
    assert [version["from_epoch"] for version in read_training(path)] == [1]
    record_training(path, _Read(tmp_path, HALVED), first_epoch=1)  # --start-over's first epoch
    assert [(version["from_epoch"], version["patients"]) for version in read_training(path)] == [(1, HALVED)]


def test_no_record_is_none_and_a_broken_one_is_named(tmp_path):
    path = tmp_path / "trained_on.json"
    assert read_training(path) is None
    path.write_text(json.dumps({"format": 1, "versions": [{"from_epoch": 1}]}))
    with pytest.raises(ProvenanceError, match=rf"^{path}: not a record of the files a run trained on") as caught:
        read_training(path)
    assert isinstance(caught.value, UserError)


def test_a_disagreement_names_the_first_differing_file_and_who_holds_what():
    accounts = {"fold 1's training": A["pt_2"], "fold 2's training": HALVED["pt_2"],
                "fold 3's out-of-fold prediction": HALVED["pt_2"], "the data now": {"ct.csv": "c" * 64}}
    assert disagreement(accounts) == ("dose.csv", {"d" * 64: ["fold 1's training"],
                                                   "e" * 64: ["fold 2's training", "fold 3's out-of-fold prediction"],
                                                   None: ["the data now"]})
    assert disagreement({"one": A["pt_1"], "another": dict(A["pt_1"])}) is None
    assert differing_files(A["pt_2"], {**HALVED["pt_2"], "beams.csv": "f" * 64}) == ["beams.csv", "dose.csv"]


def test_the_digest_of_a_cohorts_files_is_that_of_their_canonical_listing():
    listing = json.dumps(A, sort_keys=True, separators=(",", ":"))
    assert digest(A) == hashlib.sha256(listing.encode()).hexdigest()
    assert digest(dict(reversed(list(A.items())))) == digest(A) != digest(HALVED)
