"""The node's journal: objects, patients' states and reasons, send attempts; readable while the
node runs and after it was killed."""

import json
import os
import sqlite3
import time

import pytest

from provided_code.apps.node.journal import (
    FAILED,
    FAILED_SEND,
    PREDICTED,
    PREDICTING,
    READY,
    RECEIVING,
    SCHEMA,
    SCHEMA_VERSION,
    SENT,
    Journal,
    JournalError,
    summary_lines,
)
from provided_code.apps.node.readiness import References


def add_ct(journal, uid, series="1.7", frame="1.5", now=100.0):
    return journal.add_object(sop_instance_uid=uid, sop_class_uid="1.2.840.10008.5.1.4.1.1.2", modality="CT",
                       study_uid="1.4", series_uid=series, frame_uid=frame, patient_id="P1", path=f"/s/{uid}.dcm",
                       size=10, calling_ae="TPS", now=now)


def add_structure_set(journal, uid="1.8", images=("1.9.1", "1.9.2"), series=("1.7",), now=100.0):
    journal.add_object(sop_instance_uid=uid, sop_class_uid="1.2.840.10008.5.1.4.1.1.481.3", modality="RTSTRUCT",
                       study_uid="1.4", series_uid="1.3", frame_uid="1.5", patient_id="P1", path=f"/s/{uid}.dcm",
                       size=10, calling_ae="TPS", now=now)
    return journal.add_structure_set(uid, "P1", "1.4", References("1.5", tuple(series), tuple(images)), now=now)


@pytest.fixture
def journal(tmp_path):
    opened = Journal(tmp_path / "journal.sqlite")
    yield opened
    opened.close()


def test_the_journal_is_sqlite_in_write_ahead_mode(journal):
    assert journal._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert journal._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_structure_set_waits_for_every_image_it_names(journal):
    assert add_structure_set(journal) == "new"
    patient = journal.patient("1.8")
    assert patient["state"] == RECEIVING and patient["series_uid"] == "1.7"
    add_ct(journal, "1.9.1", now=101.0)
    status = journal.series_status(journal.patient("1.8"))
    assert (status.series_uid, status.expected, status.present, status.slices) == ("1.7", 2, 1, 1)
    assert not status.complete
    add_ct(journal, "1.9.2", now=102.0)
    status = journal.series_status(journal.patient("1.8"))
    assert status.complete and status.last_received == 102.0


def test_without_named_images_the_one_ct_series_of_its_frame_stands_in(journal):
    add_structure_set(journal, images=(), series=())
    add_ct(journal, "1.9.1", series="1.70")
    add_ct(journal, "1.9.2", series="1.70")
    status = journal.series_status(journal.patient("1.8"))
    assert status.series_uid == "1.70" and status.complete
    add_ct(journal, "1.9.3", series="1.71")
    assert "2 CT series share its frame of reference" in journal.series_status(journal.patient("1.8")).problem


def test_named_images_arriving_in_another_series_is_a_problem(journal):
    add_structure_set(journal)
    add_ct(journal, "1.9.1", series="1.99")
    assert "not in the series 1.7 it names" in journal.series_status(journal.patient("1.8")).problem


def test_a_structure_set_naming_two_series_fails_at_once(journal):
    add_structure_set(journal, series=("1.7", "1.77"))
    patient = journal.patient("1.8")
    assert patient["state"] == FAILED and "it names 2 image series" in patient["reason"]


def test_states_move_only_forward_and_every_one_is_in_the_history(journal):
    add_structure_set(journal)
    assert not journal.transition("1.8", PREDICTED)  # not from receiving
    for state in (READY, PREDICTING, PREDICTED, SENT):
        assert journal.transition("1.8", state, f"to {state}")
    assert not journal.transition("1.8", FAILED) and not journal.transition("1.8", READY)
    assert [s for s, _ in journal.history("1.8")] == [RECEIVING, READY, PREDICTING, PREDICTED, SENT]
    assert journal.history("1.8")[-1] == (SENT, "to sent")


def test_a_failed_patient_is_tried_again_when_its_objects_come_again(journal):
    add_structure_set(journal)
    journal.transition("1.8", FAILED, "incomplete", failed_in=RECEIVING)
    assert journal.reopen_failed("1.7", "1.5") == ["1.8"]
    assert journal.patient("1.8")["state"] == RECEIVING
    journal.transition("1.8", FAILED, "incomplete", failed_in=RECEIVING)
    assert add_structure_set(journal) == "reopened" and journal.patient("1.8")["state"] == RECEIVING
    assert add_structure_set(journal) == RECEIVING


def test_a_patient_whose_send_failed_is_sent_again_not_predicted_again(journal):
    add_structure_set(journal)
    for state in (READY, PREDICTING):
        journal.transition("1.8", state)
    journal.transition("1.8", PREDICTED, output="/s/results/1.8")
    journal.transition("1.8", FAILED, "not sent", failed_in="sending")
    add_ct(journal, "1.9.1")
    assert journal.reopen_failed("1.7", "1.5") == ["1.8"] and journal.patient("1.8")["state"] == PREDICTED


def test_send_attempts_are_numbered_and_a_pending_one_is_closed_after_a_crash(journal):
    add_structure_set(journal)
    first, attempt = journal.start_send("1.8", "PACS@h:104")
    journal.finish_send(first, FAILED_SEND, "no connection")
    second, attempt = journal.start_send("1.8", "PACS@h:104")
    assert attempt == 2
    assert journal.close_interrupted_sends() == 1
    assert [(row["attempt"], row["outcome"]) for row in journal.sends("1.8")] == [(1, FAILED_SEND), (2, "interrupted")]


def test_the_reference_dose_is_the_clinics_newest_not_our_own(journal):
    for uid, own, now in (("1.20", False, 1.0), ("1.21", False, 2.0), ("1.22", True, 3.0)):
        journal.add_object(sop_instance_uid=uid, sop_class_uid="1.2.840.10008.5.1.4.1.1.481.2", modality="RTDOSE",
                           study_uid="1.4", series_uid="1.30", frame_uid="1.5", patient_id="P1", path=f"/s/{uid}",
                           size=1, calling_ae="TPS", own=own, now=now)
    assert journal.reference_dose("1.5") == "/s/1.21" and journal.reference_dose("1.6") is None


def test_an_object_sent_again_is_counted_not_duplicated(journal):
    assert add_ct(journal, "1.9.1", now=1.0) is True
    assert add_ct(journal, "1.9.1", now=2.0) is False
    row = journal._db.execute("SELECT times, first_received, received FROM objects").fetchone()
    assert tuple(row) == (2, 1.0, 2.0)


def test_status_reads_the_journal_of_a_running_node_and_sums_it_up(journal, tmp_path):
    add_structure_set(journal)
    add_ct(journal, "1.9.1")
    journal.transition("1.8", FAILED, "incomplete after 1 s", failed_in=RECEIVING)
    reader = Journal(tmp_path / "journal.sqlite", readonly=True)
    lines = summary_lines(reader)
    assert "Objects received: 2 (CT 1, RTSTRUCT 1), 0.0 MB" in lines[1]
    assert lines[2] == "Patients: 1, failed 1"
    assert lines[-1].endswith("P1 failed 1.8: incomplete after 1 s")
    with pytest.raises(sqlite3.OperationalError):  # read-only
        reader._db.execute("DELETE FROM objects")
    reader.close()


def test_status_of_a_folder_without_journal_says_so(tmp_path):
    with pytest.raises(JournalError, match="no journal here"):
        Journal(tmp_path / "journal.sqlite", readonly=True)


# A journal as format 1 (before refusals and warnings, its sends' failed outcome spelled as the state)
FORMAT_1 = """
CREATE TABLE objects (
    sop_instance_uid TEXT PRIMARY KEY, sop_class_uid TEXT NOT NULL, modality TEXT NOT NULL,
    study_uid TEXT NOT NULL, series_uid TEXT NOT NULL, frame_uid TEXT NOT NULL, patient_id TEXT NOT NULL,
    path TEXT NOT NULL, bytes INTEGER NOT NULL, calling_ae TEXT NOT NULL, own INTEGER NOT NULL,
    first_received REAL NOT NULL, received REAL NOT NULL, times INTEGER NOT NULL);
CREATE TABLE patients (
    structure_set_uid TEXT PRIMARY KEY, patient_id TEXT NOT NULL, study_uid TEXT NOT NULL,
    frame_uid TEXT NOT NULL, series_uid TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,
    failed_in TEXT NOT NULL, output TEXT NOT NULL, send_attempts INTEGER NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE TABLE referenced_images (
    structure_set_uid TEXT NOT NULL, sop_instance_uid TEXT NOT NULL, PRIMARY KEY (structure_set_uid, sop_instance_uid));
CREATE TABLE history (
    id INTEGER PRIMARY KEY AUTOINCREMENT, structure_set_uid TEXT NOT NULL, time REAL NOT NULL,
    state TEXT NOT NULL, reason TEXT NOT NULL);
CREATE TABLE sends (
    id INTEGER PRIMARY KEY AUTOINCREMENT, structure_set_uid TEXT NOT NULL, attempt INTEGER NOT NULL,
    destination TEXT NOT NULL, started REAL NOT NULL, finished REAL, outcome TEXT NOT NULL, detail TEXT NOT NULL);
INSERT INTO patients VALUES ('1.8', 'P1', '1.4', '1.5', '1.7', 'failed', 'not sent to PACS@h:104 after 1 attempts',
                             'sending', '/s/results/1.8', 1, 1.0, 2.0);
INSERT INTO sends VALUES (1, '1.8', 1, 'PACS@h:104', 1.5, 2.0, 'failed', 'cannot be reached (no connection)');
PRAGMA user_version=1;
"""


@pytest.fixture
def format_1_journal(tmp_path):
    path = tmp_path / "journal.sqlite"
    with sqlite3.connect(path) as db:
        db.executescript(FORMAT_1)
    db.close()
    return path


def test_a_format_1_journal_reads_as_the_current_format_and_is_left_unchanged_by_status(format_1_journal):
    reader = Journal(format_1_journal, readonly=True)
    summary = reader.summary()
    reader.close()
    assert summary["sends"] == {FAILED_SEND: 1} and summary["refusals"] == 0
    assert summary["states"] == {FAILED: 1}
    with sqlite3.connect(format_1_journal) as db:
        assert db.execute("SELECT outcome FROM sends").fetchone()[0] == "failed"
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    db.close()


def test_a_node_brings_a_format_1_journal_to_the_current_format(format_1_journal):
    journal = Journal(format_1_journal)
    try:
        assert [row["outcome"] for row in journal.sends("1.8")] == [FAILED_SEND]
        assert journal.patient("1.8")["warnings"] == "" and journal.refusals() == []
        assert journal.patient("1.8")["trust"] == ""
        add_ct(journal, "1.9.1")
        assert journal.reopen_failed("1.7", "1.5") == ["1.8"] and journal.patient("1.8")["state"] == PREDICTED
    finally:
        journal.close()
    assert Journal(format_1_journal, readonly=True).version == SCHEMA_VERSION == 4


@pytest.fixture
def format_2_journal(tmp_path):
    """A format-2 journal (before patients.trust) with one predicted patient."""
    path = tmp_path / "journal.sqlite"
    format_2 = SCHEMA.replace(", trust TEXT NOT NULL DEFAULT ''", "").replace(",\n    next_send REAL, send_until REAL", "")
    format_2 = format_2.replace("CREATE INDEX IF NOT EXISTS patients_by_next_send ON patients (next_send);", "")
    format_2 = format_2[:format_2.index("CREATE TABLE IF NOT EXISTS connections_refused")]  # format 4's
    assert format_2 != SCHEMA
    with sqlite3.connect(path) as db:
        db.executescript(format_2)
        db.execute("INSERT INTO patients VALUES ('1.8', 'P1', '1.4', '1.5', '1.7', 'predicted', 'epoch 3, 1.0 s', '', "
                   "'/s/results/1.8', 0, 1.0, 2.0, '')")
        db.execute("PRAGMA user_version=2")
    db.close()
    return path


def test_a_format_2_journal_reads_without_checks_and_a_node_brings_it_to_the_current_format(format_2_journal):
    reader = Journal(format_2_journal, readonly=True)
    lines = summary_lines(reader)
    reader.close()
    assert lines[-1].endswith("P1 predicted 1.8: epoch 3, 1.0 s") and not any("outside" in line for line in lines)
    journal = Journal(format_2_journal)
    try:
        assert journal.version == SCHEMA_VERSION and journal.patient("1.8")["trust"] == ""
        assert journal.connections_refused() == []
    finally:
        journal.close()


def test_a_patient_outside_the_training_cohort_is_counted_and_named_with_its_reasons_by_status(journal):
    for uid, inside in (("1.8", False), ("1.18", True), ("1.28", None)):
        add_structure_set(journal, uid=uid)
        for state in (READY, PREDICTING):
            journal.transition(uid, state)
        trust = {"band": 0.9, "inside": inside, "score": 9.5 if inside is False else 1.0,
                 "p_value": 1 / 56 if inside is False else 0.5, "alpha": 0.05, "threshold": 7.8,
                 "feature": "PTV70.volume_cc", "too_small": "",
                 "reasons": ["PTV70 volume 1,480 cc; the training cohort's largest was 610 cc"] if inside is False
                 else []}
        journal.transition(uid, PREDICTED, "epoch 3", trust=json.dumps(trust if inside is not None else
                                                                      {"band": None, "inside": None}))
    lines = summary_lines(journal)
    assert "Predictions outside the training cohort: 1 of the 2 checked" in lines
    at = next(k for k, line in enumerate(lines) if line.endswith("P1 predicted 1.8: epoch 3"))
    assert lines[at + 1] == ("    Outside the training cohort (p = 0.018, alpha 0.05; flagged by PTV70.volume_cc): "
                             "PTV70 volume 1,480 cc; the training cohort's largest was 610 cc")
    assert sum(line.startswith("    Outside") for line in lines) == 1


def test_status_says_the_patients_an_uncommissioned_model_predicted(journal):
    """As the RT Dose's description and the patient's entry say it (patients.trust's uncommissioned)."""
    for uid, uncommissioned in (("1.8", False), ("1.18", True), ("1.28", True)):
        add_structure_set(journal, uid=uid)
        for state in (READY, PREDICTING):
            journal.transition(uid, state)
        journal.transition(uid, PREDICTED, "epoch 3", trust=json.dumps({"band": None, "inside": None,
                                                                        "uncommissioned": uncommissioned}))
    assert ("Uncommissioned model (no bands, no in-distribution check): 2 of the 3 patients predicted, the latest "
            "among them") in summary_lines(journal)


def test_a_refusal_is_kept_with_what_it_named_made_printable(journal):
    journal.add_refusal(sop_instance_uid="../../x", sop_class_uid="1.2.840.10008.5.1.4.1.1.2", modality="CT",
                        series_uid="1.7", frame_uid="1.5", patient_id="P\x1b1", calling_ae="TPS", peer="10.0.0.5:4000",
                        status=0xC000, reason="invalid SOPInstanceUID (digits and dots only)", now=5.0)
    [row] = journal.refusals()
    assert (row["sop_instance_uid"], row["patient_id"], row["status"], row["peer"]) == ("../../x", "P?1", 0xC000,
                                                                                          "10.0.0.5:4000")
    assert "Objects refused: 1" in summary_lines(journal)


def test_a_refused_image_of_the_patient_is_named_until_it_arrives(journal):
    add_structure_set(journal)
    add_ct(journal, "1.9.1")
    journal.add_refusal(sop_instance_uid="1.9.2", modality="CT", series_uid="1.7", status=0xC000,
                        reason="pixel data of 100 bytes, expected 2048")
    journal.add_refusal(sop_instance_uid="1.9.77", modality="CT", series_uid="1.77", status=0xC000, reason="another's")
    status = journal.series_status(journal.patient("1.8"))
    assert status.refused == ("CT 1.9.2 (status 0xC000: pixel data of 100 bytes, expected 2048)",)
    add_ct(journal, "1.9.2")  # sent again, whole
    assert journal.series_status(journal.patient("1.8")).refused == ()


def test_a_new_journal_is_the_owners_only_whatever_the_umask(tmp_path):
    umask = os.umask(0)
    try:
        journal = Journal(tmp_path / "journal.sqlite")
        add_ct(journal, "1.9.1")
        modes = {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()}
        journal.close()
    finally:
        os.umask(umask)
    assert modes == {"journal.sqlite": 0o600, "journal.sqlite-wal": 0o600, "journal.sqlite-shm": 0o600}


def test_a_refused_connection_repeated_within_the_window_counts_in_its_row(journal):
    from provided_code.apps.node.journal import REPEAT_WINDOW_S

    for now in (10.0, 20.0, 30.0):
        journal.add_connection_refusal(peer="10.0.0.5", kind="tls", reason="the client presented no certificate",
                                       now=now)
    journal.add_connection_refusal(peer="10.0.0.5", kind="tls", reason="the client presented no certificate",
                                   now=30.0 + REPEAT_WINDOW_S + 1)  # after a quiet window: a row of its own
    journal.add_connection_refusal(peer="10.0.0.6", kind="association", calling_ae="TPS\x1b", called_ae="KBP",
                                   reason="calling AE title 'TPS?' is not in --allow", now=40.0)
    rows = [(row["peer"], row["calling_ae"], row["times"], row["first"], row["last"])
            for row in journal.connections_refused()]
    assert rows == [("10.0.0.5", "", 3, 10.0, 30.0), ("10.0.0.5", "", 1, 91.0, 91.0), ("10.0.0.6", "TPS?", 1, 40.0, 40.0)]
    lines = summary_lines(journal)
    assert "Connections and associations refused: 5" in lines
    assert any(line.endswith("association from TPS? at 10.0.0.6: calling AE title 'TPS?' is not in --allow")
               for line in lines)
    assert any(line.endswith("tls from 10.0.0.5: the client presented no certificate (3 times since "
                             f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(10.0))})") for line in lines)


def _predicted(journal, uid="1.8"):
    add_structure_set(journal, uid=uid)
    for state in (READY, PREDICTING):
        journal.transition(uid, state)
    journal.transition(uid, PREDICTED, output=f"/s/results/{uid}")


def test_the_send_schedule_is_the_journals_sooner_first_and_taken_by_the_attempt(journal):
    _predicted(journal)
    assert journal.next_send() is None
    assert journal.schedule_send("1.8", 50.0) and journal.schedule_send("1.8", 70.0)  # later: it stays due at 50
    assert journal.next_send() == ("1.8", 50.0) and journal.sends_waiting() == {"1.8": 50.0}
    journal.start_send("1.8", "PACS@h:104")
    assert journal.next_send() is None  # the attempt took it
    assert journal.give_up_sending_at("1.8", 1000.0) == 1000.0 and journal.give_up_sending_at("1.8", 2000.0) == 1000.0
    journal.transition("1.8", SENT, "to PACS@h:104")
    assert not journal.schedule_send("1.8", 80.0) and journal.next_send() is None  # sent: never again


def test_it_pushes_a_patient_whose_sends_gave_up_and_not_one_sent(journal):
    _predicted(journal)
    journal.give_up_sending_at("1.8", 10.0)
    journal.transition("1.8", FAILED, "not sent", failed_in="sending")
    [(row, what)] = journal.resend("1.8", now=99.0)
    assert what == "its sends had given up: queued to send now"
    patient = journal.patient("1.8")
    assert (patient["state"], patient["next_send"], patient["send_until"], patient["send_attempts"]) == (
        PREDICTED, 99.0, None, 0)  # a new retry window from its next failure
    journal.transition("1.8", SENT, "to PACS@h:104")
    [(row, what)] = journal.resend("P1")
    assert what.startswith("already sent (to PACS@h:104)") and journal.next_send() is None
    assert journal.resend("nobody") == []


def test_attempt_numbers_go_on_after_a_push_and_the_back_off_starts_over(journal):
    """The sends table and the log number a patient's attempts from its first; a push (--resend)
    opens a new retry window, whose attempts (the back-off's count) start again."""
    _predicted(journal)
    for _ in range(2):
        send_id, _ = journal.start_send("1.8", "PACS@h:104")
        journal.finish_send(send_id, FAILED_SEND, "no connection")
    journal.transition("1.8", FAILED, "not sent", failed_in="sending")
    journal.resend("1.8")
    assert journal.patient("1.8")["send_attempts"] == 0  # the new window's
    send_id, attempt = journal.start_send("1.8", "PACS@h:104")
    assert attempt == 3 and journal.patient("1.8")["send_attempts"] == 1
    assert [row["attempt"] for row in journal.sends("1.8")] == [1, 2, 3]


def test_a_push_while_no_node_serves_the_store_says_nothing_goes_until_it_starts(tmp_path):
    from provided_code.apps.node.journal import resend_lines
    from provided_code.apps.node.store import LOCK_FILE
    from provided_code.infra.run_lock import RunLock

    journal = Journal(tmp_path / "journal.sqlite")
    _predicted(journal)
    journal.close()
    lines, pushed = resend_lines(tmp_path, "1.8")
    assert pushed and lines == ["Patient P1 (structure set 1.8): queued, but no node serves this store now: nothing "
                                "is sent until it starts"]
    with RunLock(tmp_path / LOCK_FILE, "a DICOM node"):  # what a node serving the store holds
        lines, pushed = resend_lines(tmp_path, "1.8")
    assert pushed and lines == ["Patient P1 (structure set 1.8): queued to send now"]


def test_status_shows_the_sends_waiting_and_when_each_tries_next(journal):
    _predicted(journal)
    send_id, _ = journal.start_send("1.8", "PACS@h:104")
    journal.finish_send(send_id, FAILED_SEND, "PACS@h:104 cannot be reached (no connection)")
    journal.give_up_sending_at("1.8", 86500.0)
    journal.schedule_send("1.8", 105.0)
    lines = summary_lines(journal)
    at = lines.index("Sends waiting: 1 (next attempt, attempts so far, gives up)")
    assert lines[at + 1] == (f"  P1 1.8: next {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(105.0))}, 1 "
                             f"attempt(s), gives up {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(86500.0))}; "
                             f"last: PACS@h:104 cannot be reached (no connection)")
