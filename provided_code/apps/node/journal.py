"""The node's journal: SQLite (write-ahead log, synchronous commits) at ``STORE/journal.sqlite``.

Tables: ``objects`` (every object received: its UIDs, modality, file, size, calling AE title,
times received), ``patients`` (one per structure set: its state, the reason of a failure, the CT
series it was drawn on, its result folder, the import's warnings), ``referenced_images`` (the CT
images each structure set names), ``history`` (every state a patient entered, with the reason and
time), ``sends`` (every send attempt, its destination, outcome and detail), ``refusals`` (every
object answered with a failure status: what it named, the status and why) and ``connections_refused``
(every connection or association refused before any object: a TLS handshake that failed, an AE
title not allowed, a limit, an association whose storage classes were all refused; its repeats from
the same address for the same reason within :data:`REPEAT_WINDOW_S` counted in one row). A patient's states::

    receiving -> ready -> predicting -> predicted -> sent
         \\          \\          \\            \\
          +----------+----------+------------+--> failed (with its reason)

A patient caught ``predicting`` by a crash goes back to ``ready`` (its outputs were never
committed); a ``failed`` one is tried again when any of its objects is sent again (back to
``receiving``, or to ``predicted`` when only the send had failed), and one whose send had failed
when IT asks (:meth:`Journal.resend`, ``openkbp-dicom serve --resend``).

Format 2 (``PRAGMA user_version``) added ``refusals``, ``patients.warnings`` and the send outcome
``error`` (format 1 wrote ``failed``, the patients' state's word); format 3 ``patients.trust``
(what the prediction said about itself, JSON: ``band``, the bands' nominal coverage or null, and
the in-distribution check's ``inside``, ``score``, ``p_value``, ``alpha``, ``threshold``,
``feature``, ``too_small`` and ``reasons``, and ``uncommissioned``, true when the model carries
neither bands nor the check; ``dose_ceiling`` when the dose is above the site's plausible
ceiling, :class:`provided_code.metrics.ceiling.AboveCeiling`'s fields; empty before the prediction
or for a node of format 2), format 4 ``connections_refused`` and the send schedule:
``patients.next_send`` (when a predicted patient's next send attempt is due; null when none is) and
``patients.send_until`` (when its sends give up: ``--send-retry-hours`` after its first failed
attempt). An older journal is brought to format 4 when a node opens it, and read as format 4 by
``--status`` without being changed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path

from provided_code.errors import UserError
from provided_code.infra.run_lock import is_held
from provided_code.metrics.ceiling import AboveCeiling
from provided_code.apps.node.readiness import READY, References, SeriesStatus
from provided_code.apps.node.store import JOURNAL_FILE, LOCK_FILE
from provided_code.apps.node.text import printable

# A patient's states; READY is also readiness's decision that the patient is complete
RECEIVING, PREDICTING, PREDICTED = "receiving", "predicting", "predicted"
SENT, FAILED = "sent", "failed"
STATES = (RECEIVING, READY, PREDICTING, PREDICTED, SENT, FAILED)
NEXT = {
    RECEIVING: {READY, FAILED},
    READY: {PREDICTING, FAILED},
    PREDICTING: {PREDICTED, FAILED, READY},
    PREDICTED: {SENT, FAILED},
    SENT: set(),
    FAILED: {RECEIVING, PREDICTED},
}
SCHEMA_VERSION = 4
SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    sop_instance_uid TEXT PRIMARY KEY, sop_class_uid TEXT NOT NULL, modality TEXT NOT NULL,
    study_uid TEXT NOT NULL, series_uid TEXT NOT NULL, frame_uid TEXT NOT NULL, patient_id TEXT NOT NULL,
    path TEXT NOT NULL, bytes INTEGER NOT NULL, calling_ae TEXT NOT NULL, own INTEGER NOT NULL,
    first_received REAL NOT NULL, received REAL NOT NULL, times INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS objects_by_series ON objects (series_uid, modality);
CREATE INDEX IF NOT EXISTS objects_by_frame ON objects (frame_uid, modality);
CREATE TABLE IF NOT EXISTS patients (
    structure_set_uid TEXT PRIMARY KEY, patient_id TEXT NOT NULL, study_uid TEXT NOT NULL,
    frame_uid TEXT NOT NULL, series_uid TEXT NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL,
    failed_in TEXT NOT NULL, output TEXT NOT NULL, send_attempts INTEGER NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, warnings TEXT NOT NULL DEFAULT '', trust TEXT NOT NULL DEFAULT '',
    next_send REAL, send_until REAL);
CREATE INDEX IF NOT EXISTS patients_by_state ON patients (state);
CREATE INDEX IF NOT EXISTS patients_by_next_send ON patients (next_send);
CREATE TABLE IF NOT EXISTS referenced_images (
    structure_set_uid TEXT NOT NULL, sop_instance_uid TEXT NOT NULL,
    PRIMARY KEY (structure_set_uid, sop_instance_uid));
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY AUTOINCREMENT, structure_set_uid TEXT NOT NULL, time REAL NOT NULL,
    state TEXT NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS history_by_patient ON history (structure_set_uid);
CREATE TABLE IF NOT EXISTS sends (
    id INTEGER PRIMARY KEY AUTOINCREMENT, structure_set_uid TEXT NOT NULL, attempt INTEGER NOT NULL,
    destination TEXT NOT NULL, started REAL NOT NULL, finished REAL, outcome TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS sends_by_patient ON sends (structure_set_uid);
CREATE TABLE IF NOT EXISTS refusals (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, calling_ae TEXT NOT NULL, peer TEXT NOT NULL,
    sop_instance_uid TEXT NOT NULL, sop_class_uid TEXT NOT NULL, modality TEXT NOT NULL, series_uid TEXT NOT NULL,
    frame_uid TEXT NOT NULL, patient_id TEXT NOT NULL, status INTEGER NOT NULL, reason TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS refusals_by_instance ON refusals (sop_instance_uid);
CREATE INDEX IF NOT EXISTS refusals_by_series ON refusals (series_uid);
CREATE TABLE IF NOT EXISTS connections_refused (
    id INTEGER PRIMARY KEY AUTOINCREMENT, first REAL NOT NULL, last REAL NOT NULL, times INTEGER NOT NULL,
    peer TEXT NOT NULL, calling_ae TEXT NOT NULL, called_ae TEXT NOT NULL, kind TEXT NOT NULL, reason TEXT NOT NULL);
"""
# A send attempt's outcomes (sends.outcome)
PENDING, OK, FAILED_SEND, INTERRUPTED = "pending", "ok", "error", "interrupted"
FORMAT_1_FAILED_SEND = "failed"  # what format 1 wrote for FAILED_SEND
# What refused a connection or association (connections_refused.kind)
TLS_REFUSED, ASSOCIATION_REFUSED, LIMIT_REFUSED, CLASSES_REFUSED = "tls", "association", "limit", "sop class"
REPEAT_WINDOW_S = 60.0  # a refusal repeated within this many seconds of the last counts in the same row
QUEUED = "queued to send now"  # what --resend did to a patient it pushed


def _format_1_to_2(db) -> None:
    """A format-1 journal's tables as format 2 has them (the new table is made by SCHEMA)."""
    db.execute("ALTER TABLE patients ADD COLUMN warnings TEXT NOT NULL DEFAULT ''")
    db.execute("UPDATE sends SET outcome = ? WHERE outcome = ?", (FAILED_SEND, FORMAT_1_FAILED_SEND))


def _format_2_to_3(db) -> None:
    db.execute("ALTER TABLE patients ADD COLUMN trust TEXT NOT NULL DEFAULT ''")


def _format_3_to_4(db) -> None:
    """Format 4's columns (its new table is made by SCHEMA)."""
    db.execute("ALTER TABLE patients ADD COLUMN next_send REAL")
    db.execute("ALTER TABLE patients ADD COLUMN send_until REAL")


class JournalError(UserError, RuntimeError):
    """A journal that cannot be used (missing for ``--status``, or of a newer format)."""


class Journal:
    """One SQLite connection shared by the node's threads (serialised by a lock). A new journal's
    files are the owner's only (0600), whatever the umask: SQLite gives its write-ahead log the
    database file's permissions."""

    def __init__(self, path: Path | str, readonly: bool = False):
        self.path = Path(path)
        self._lock = threading.RLock()
        if readonly:
            if not self.path.is_file():
                raise JournalError(f"{self.path}: no journal here (is this a node's --store folder?)")
            self._db = sqlite3.connect(self.path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None,
                                       check_same_thread=False, timeout=10)
        else:
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))  # before SQLite creates it with 0644
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a C-STORE answered 'success' survives a power cut
        self._db.row_factory = sqlite3.Row
        self.version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if self.version > SCHEMA_VERSION:
            raise JournalError(f"{self.path}: journal format {self.version} is newer than this program's "
                               f"{SCHEMA_VERSION}")
        if not readonly:
            with self._transaction() as db:
                if self.version == 1:
                    _format_1_to_2(db)
                if self.version in (1, 2):
                    _format_2_to_3(db)
                if self.version in (1, 2, 3):
                    _format_3_to_4(db)
                for statement in SCHEMA.split(";"):  # executescript would commit on its own
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            self.version = SCHEMA_VERSION

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _transaction(self):
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _query(self, sql: str, args=()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    # Objects

    def add_object(self, *, sop_instance_uid: str, sop_class_uid: str, modality: str, study_uid: str,
                   series_uid: str, frame_uid: str, patient_id: str, path: str, size: int, calling_ae: str,
                   own: bool = False, now: float | None = None) -> bool:
        """Record a received object (again: its latest arrival). True when it is new."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            known = db.execute("SELECT 1 FROM objects WHERE sop_instance_uid = ?", (sop_instance_uid,)).fetchone()
            if known:
                db.execute("UPDATE objects SET received = ?, times = times + 1, path = ?, bytes = ?, calling_ae = ? "
                           "WHERE sop_instance_uid = ?", (now, path, size, calling_ae, sop_instance_uid))
            else:
                db.execute("INSERT INTO objects VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)",
                           (sop_instance_uid, sop_class_uid, modality, study_uid, series_uid, frame_uid, patient_id,
                            path, size, calling_ae, int(own), now, now))
        return not known

    def object_path(self, sop_instance_uid: str) -> str | None:
        rows = self._query("SELECT path FROM objects WHERE sop_instance_uid = ?", (sop_instance_uid,))
        return rows[0]["path"] if rows else None

    def reference_dose(self, frame_uid: str) -> str | None:
        """The newest RT Dose received in ``frame_uid`` that this node did not write, or None."""
        rows = self._query("SELECT path FROM objects WHERE frame_uid = ? AND modality = 'RTDOSE' AND own = 0 "
                           "ORDER BY received DESC LIMIT 1", (frame_uid,))
        return rows[0]["path"] if rows else None

    def add_refusal(self, *, sop_instance_uid: str, sop_class_uid: str = "", modality: str = "", series_uid: str = "",
                    frame_uid: str = "", patient_id: str = "", calling_ae: str = "", peer: str = "", status: int,
                    reason: str, now: float | None = None) -> None:
        """Record an object answered with a failure ``status`` and why, with what it named (each
        value as the network sent it, made printable: it may be no valid UID at all)."""
        now = time.time() if now is None else now
        values = [printable(value) for value in (calling_ae, peer, sop_instance_uid, sop_class_uid, modality,
                                                 series_uid, frame_uid, patient_id)]
        with self._transaction() as db:
            db.execute("INSERT INTO refusals (time, calling_ae, peer, sop_instance_uid, sop_class_uid, modality, "
                       "series_uid, frame_uid, patient_id, status, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (now, *values, int(status), reason))

    def refusals(self) -> list[sqlite3.Row]:
        return self._query("SELECT * FROM refusals ORDER BY id")

    def add_connection_refusal(self, *, peer: str, kind: str, reason: str, calling_ae: str = "", called_ae: str = "",
                               now: float | None = None) -> bool:
        """Record a connection or association refused before any object: ``peer`` (the client's
        address), ``kind`` (:data:`TLS_REFUSED`, ...), why, and the AE titles it named (each made
        printable). The same refusal again within :data:`REPEAT_WINDOW_S` of its last counts in its
        row (``times``, ``last``). True when a new row."""
        now = time.time() if now is None else now
        values = [printable(value, limit) for value, limit in ((peer, 64), (calling_ae, 64), (called_ae, 64),
                                                               (kind, 64), (reason, 400))]
        with self._transaction() as db:
            row = db.execute("SELECT id FROM connections_refused WHERE peer = ? AND calling_ae = ? AND called_ae = ? "
                             "AND kind = ? AND reason = ? AND last >= ? ORDER BY id DESC LIMIT 1",
                             (*values, now - REPEAT_WINDOW_S)).fetchone()
            if row is not None:
                db.execute("UPDATE connections_refused SET times = times + 1, last = ? WHERE id = ?", (now, row["id"]))
                return False
            db.execute("INSERT INTO connections_refused (first, last, times, peer, calling_ae, called_ae, kind, reason) "
                       "VALUES (?, ?, 1, ?, ?, ?, ?, ?)", (now, now, *values))
            return True

    def connections_refused(self) -> list[sqlite3.Row]:
        return self._query("SELECT * FROM connections_refused ORDER BY id")

    # Patients

    def add_structure_set(self, uid: str, patient_id: str, study_uid: str, references: References,
                          now: float | None = None) -> str:
        """A structure set received: ``"new"`` (a patient now ``receiving``), ``"reopened"`` (it had
        failed and is tried again) or the state of the patient it already is."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            row = db.execute("SELECT state FROM patients WHERE structure_set_uid = ?", (uid,)).fetchone()
            if row is not None:
                return "reopened" if row["state"] == FAILED and self._reopen(db, uid, now) else row["state"]
            series = references.series_uids[0] if len(references.series_uids) == 1 else ""
            db.execute("INSERT INTO patients (structure_set_uid, patient_id, study_uid, frame_uid, series_uid, state, "
                       "reason, failed_in, output, send_attempts, created, updated) "
                       "VALUES (?, ?, ?, ?, ?, ?, '', '', '', 0, ?, ?)",
                       (uid, patient_id, study_uid, references.frame_uid, series, RECEIVING, now, now))
            db.executemany("INSERT OR IGNORE INTO referenced_images VALUES (?, ?)",
                           [(uid, image) for image in references.images])
            db.execute("INSERT INTO history (structure_set_uid, time, state, reason) VALUES (?, ?, ?, '')",
                       (uid, now, RECEIVING))
            if len(references.series_uids) > 1:
                self._set(db, uid, FAILED, now, f"it names {len(references.series_uids)} image series "
                                                 f"({', '.join(references.series_uids)}); the node predicts on one CT "
                                                 f"series", failed_in=RECEIVING)
        return "new"

    def reopen_failed(self, series_uid: str, frame_uid: str, now: float | None = None) -> list[str]:
        """Patients that had failed and whose CT series (or frame of reference, when they name no
        series) an object just arrived in: tried again. Returns their UIDs."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            rows = db.execute("SELECT structure_set_uid FROM patients WHERE state = ? AND "
                              "(series_uid = ? OR (series_uid = '' AND frame_uid = ?))",
                              (FAILED, series_uid, frame_uid)).fetchall()
            return [row["structure_set_uid"] for row in rows if self._reopen(db, row["structure_set_uid"], now)]

    def _reopen(self, db, uid: str, now: float) -> bool:
        row = db.execute("SELECT failed_in, output FROM patients WHERE structure_set_uid = ?", (uid,)).fetchone()
        if row["failed_in"] == "sending" and row["output"]:
            self._set(db, uid, PREDICTED, now, "sent again", send_attempts=0)
        else:
            self._set(db, uid, RECEIVING, now, "objects sent again")
        return True

    def patient(self, uid: str) -> sqlite3.Row | None:
        rows = self._query("SELECT * FROM patients WHERE structure_set_uid = ?", (uid,))
        return rows[0] if rows else None

    def patients(self, *states: str) -> list[sqlite3.Row]:
        marks = ", ".join("?" * len(states))
        return self._query(f"SELECT * FROM patients WHERE state IN ({marks}) ORDER BY created", states)

    def transition(self, uid: str, state: str, reason: str = "", expect: tuple[str, ...] | None = None,
                   failed_in: str = "", now: float | None = None, **fields) -> bool:
        """Move a patient to ``state`` (with ``reason``) if it stands in one of ``expect`` (default:
        any state from which ``state`` may be entered); False when it does not."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            row = db.execute("SELECT state FROM patients WHERE structure_set_uid = ?", (uid,)).fetchone()
            if row is None:
                return False
            allowed = expect if expect is not None else tuple(s for s, nxt in NEXT.items() if state in nxt)
            if row["state"] not in allowed or state not in NEXT[row["state"]]:
                return False
            self._set(db, uid, state, now, reason, failed_in=failed_in, **fields)
            return True

    @staticmethod
    def _set(db, uid: str, state: str, now: float, reason: str, failed_in: str = "", **fields) -> None:
        columns = {"state": state, "reason": reason, "failed_in": failed_in, "updated": now,
                   "next_send": None, "send_until": None, **fields}  # a new state: no send scheduled
        assignments = ", ".join(f"{name} = ?" for name in columns)
        db.execute(f"UPDATE patients SET {assignments} WHERE structure_set_uid = ?", (*columns.values(), uid))
        db.execute("INSERT INTO history (structure_set_uid, time, state, reason) VALUES (?, ?, ?, ?)",
                   (uid, now, state, reason))

    def history(self, uid: str) -> list[tuple[str, str]]:
        return [(row["state"], row["reason"]) for row in
                self._query("SELECT state, reason FROM history WHERE structure_set_uid = ? ORDER BY id", (uid,))]

    def series_status(self, patient: sqlite3.Row) -> SeriesStatus:
        """How far the CT series of ``patient`` has arrived (see :class:`SeriesStatus`)."""
        uid, named, frame = patient["structure_set_uid"], patient["series_uid"], patient["frame_uid"]
        with self._lock:
            expected = self._db.execute("SELECT COUNT(*) FROM referenced_images WHERE structure_set_uid = ?",
                                        (uid,)).fetchone()[0]
            found = dict(self._db.execute(
                "SELECT o.series_uid, COUNT(*) FROM referenced_images r JOIN objects o "
                "ON o.sop_instance_uid = r.sop_instance_uid WHERE r.structure_set_uid = ? AND o.modality = 'CT' "
                "GROUP BY o.series_uid", (uid,)).fetchall())
            problem, series = "", named
            if len(found) > 1:
                problem = f"the CT images it names arrived in {len(found)} series ({', '.join(sorted(found))})"
            elif found and named and named not in found:
                problem = (f"the CT images it names arrived in series {next(iter(found))}, not in the series "
                           f"{named} it names")
            elif found:
                series = next(iter(found))
            elif not named and not expected:
                candidates = [row[0] for row in self._db.execute(
                    "SELECT DISTINCT series_uid FROM objects WHERE frame_uid = ? AND modality = 'CT'", (frame,))]
                if len(candidates) > 1:
                    problem = (f"it names no CT series and {len(candidates)} CT series share its frame of reference "
                               f"{frame}")
                elif candidates:
                    series = candidates[0]
            slices = last = 0
            if series:
                slices, last = self._db.execute("SELECT COUNT(*), MAX(received) FROM objects WHERE series_uid = ? "
                                                "AND modality = 'CT'", (series,)).fetchone()
            own = self._db.execute("SELECT received FROM objects WHERE sop_instance_uid = ?", (uid,)).fetchone()
            refused = self._refused(uid, series, frame, expected)
        last = max(last or 0.0, own[0] if own else patient["created"], patient["updated"])
        return SeriesStatus(series, expected, sum(found.values()), slices, last, problem, refused)

    def _refused(self, uid: str, series: str, frame: str, expected: int) -> tuple[str, ...]:
        """The objects of a patient refused and not received since: the images its structure set
        names, CT images of its series, or (naming none) of its frame of reference."""
        rows = self._db.execute(
            "SELECT * FROM refusals r WHERE NOT EXISTS (SELECT 1 FROM objects o WHERE o.sop_instance_uid = "
            "r.sop_instance_uid) AND (r.sop_instance_uid IN (SELECT sop_instance_uid FROM referenced_images WHERE "
            "structure_set_uid = ?) OR (? != '' AND r.series_uid = ?) OR (? = 0 AND ? != '' AND r.frame_uid = ? "
            "AND r.modality = 'CT')) ORDER BY r.id", (uid, series, series, expected, frame, frame)).fetchall()
        latest = {row["sop_instance_uid"]: row for row in rows}  # an object refused twice: its last refusal
        return tuple(f"{row['modality'] or 'object'} {row['sop_instance_uid']} (status 0x{row['status']:04X}: "
                     f"{row['reason']})" for row in latest.values())

    # Sends

    def schedule_send(self, uid: str, due: float) -> bool:
        """A predicted patient's next send attempt due at ``due`` (or when it was already due, if sooner:
        a patient is never scheduled twice). False when the patient is not ``predicted``."""
        with self._transaction() as db:
            return db.execute("UPDATE patients SET next_send = CASE WHEN next_send IS NULL OR next_send > ? THEN ? "
                              "ELSE next_send END WHERE structure_set_uid = ? AND state = ?",
                              (due, due, uid, PREDICTED)).rowcount > 0

    def next_send(self) -> tuple[str, float] | None:
        """The predicted patient whose send attempt is due first, and when: ``(uid, due)``."""
        rows = self._query("SELECT structure_set_uid, next_send FROM patients WHERE state = ? AND next_send IS NOT NULL "
                           "ORDER BY next_send LIMIT 1", (PREDICTED,))
        return (rows[0][0], rows[0][1]) if rows else None

    def sends_waiting(self) -> dict[str, float]:
        """Every predicted patient with a send attempt scheduled, and when it is due."""
        return dict(self._query("SELECT structure_set_uid, next_send FROM patients WHERE state = ? AND next_send IS NOT "
                                "NULL", (PREDICTED,)))

    def give_up_sending_at(self, uid: str, when: float) -> float:
        """When the sends of patient ``uid`` give up: ``when`` if not set yet since it was predicted
        (or pushed again), else the time set then. Returns it."""
        with self._transaction() as db:
            db.execute("UPDATE patients SET send_until = ? WHERE structure_set_uid = ? AND send_until IS NULL",
                       (when, uid))
            return db.execute("SELECT send_until FROM patients WHERE structure_set_uid = ?", (uid,)).fetchone()[0]

    def resend(self, wanted: str, now: float | None = None) -> list[tuple[sqlite3.Row, str]]:
        """IT pushes the patients named ``wanted`` (a structure set UID or a PatientID) to be sent now:
        a predicted one is due now; one whose sends gave up is ``predicted`` again, due now, with a new
        retry window; any other is left alone. Returns each patient named, with what was done."""
        now = time.time() if now is None else now
        done = []
        with self._transaction() as db:
            rows = db.execute("SELECT * FROM patients WHERE structure_set_uid = ? OR patient_id = ? ORDER BY created",
                              (wanted, wanted)).fetchall()
            for row in rows:
                uid, state = row["structure_set_uid"], row["state"]
                if state == PREDICTED:
                    db.execute("UPDATE patients SET next_send = ? WHERE structure_set_uid = ?", (now, uid))
                    done.append((row, QUEUED))
                elif state == FAILED and row["failed_in"] == "sending" and row["output"]:
                    self._set(db, uid, PREDICTED, now, "sent again by --resend", send_attempts=0, next_send=now)
                    done.append((row, f"its sends had given up: {QUEUED}"))
                elif state == SENT:
                    done.append((row, f"already sent ({row['reason']}): left alone"))
                else:
                    done.append((row, f"{state}, nothing to send yet: left alone"))
        return done

    def start_send(self, uid: str, destination: str, now: float | None = None) -> tuple[int, int]:
        """Record a send attempt before it starts (its schedule taken): ``(its id, its number)``, the
        patient's attempts numbered on from its first (a push by ``--resend`` or objects sent again
        open a new retry window, ``patients.send_attempts`` counting the window's, and number on)."""
        now = time.time() if now is None else now
        with self._transaction() as db:
            attempt = db.execute("SELECT COUNT(*) FROM sends WHERE structure_set_uid = ?", (uid,)).fetchone()[0] + 1
            db.execute("UPDATE patients SET send_attempts = send_attempts + 1, next_send = NULL "
                       "WHERE structure_set_uid = ?", (uid,))
            cursor = db.execute("INSERT INTO sends (structure_set_uid, attempt, destination, started, outcome, detail) "
                                "VALUES (?, ?, ?, ?, ?, '')", (uid, attempt, destination, now, PENDING))
            return cursor.lastrowid, attempt

    def finish_send(self, send_id: int, outcome: str, detail: str = "", now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._transaction() as db:
            db.execute("UPDATE sends SET finished = ?, outcome = ?, detail = ? WHERE id = ?",
                       (now, outcome, detail, send_id))

    def close_interrupted_sends(self) -> int:
        """Sends a crash left pending: recorded as interrupted (whether the destination has the
        object is unknown; the node sends it again). Returns how many."""
        with self._transaction() as db:
            return db.execute("UPDATE sends SET outcome = ?, detail = 'the node stopped during the attempt' "
                              "WHERE outcome = ?", (INTERRUPTED, PENDING)).rowcount

    def sends(self, uid: str) -> list[sqlite3.Row]:
        return self._query("SELECT * FROM sends WHERE structure_set_uid = ? ORDER BY id", (uid,))

    # Summary

    def summary(self) -> dict:
        """Counts and the latest patients, for ``openkbp-dicom serve --status``."""
        with self._lock:
            db = self._db
            objects = {row[0]: (row[1], row[2] or 0) for row in
                       db.execute("SELECT modality, COUNT(*), SUM(bytes) FROM objects GROUP BY modality")}
            last_object = db.execute("SELECT MAX(received) FROM objects").fetchone()[0]
            states = dict(db.execute("SELECT state, COUNT(*) FROM patients GROUP BY state").fetchall())
            sends = {}
            for outcome, count in db.execute("SELECT outcome, COUNT(*) FROM sends GROUP BY outcome").fetchall():
                outcome = FAILED_SEND if self.version < 2 and outcome == FORMAT_1_FAILED_SEND else outcome
                sends[outcome] = sends.get(outcome, 0) + count
            trust = "trust" if self.version >= 3 else "'' AS trust"  # format 2 kept none
            recent = [dict(row) for row in db.execute(
                f"SELECT structure_set_uid, patient_id, state, reason, updated, {trust} FROM patients "
                "ORDER BY updated DESC LIMIT 20")]
            checked = [json.loads(row[0]) for row in db.execute(f"SELECT {trust} FROM patients")
                       if row[0]] if self.version >= 3 else []
            latest = db.execute(f"SELECT p.{trust} FROM history h JOIN patients p ON p.structure_set_uid = "
                                f"h.structure_set_uid WHERE h.state = ? ORDER BY h.id DESC LIMIT 1",
                                (PREDICTED,)).fetchone() if self.version >= 3 else None
            latest = json.loads(latest[0]) if latest and latest[0] else {}
            failed_sends = [dict(row) for row in db.execute(
                "SELECT structure_set_uid, attempt, destination, finished, detail FROM sends WHERE outcome != ? "
                "ORDER BY id DESC LIMIT 5", (OK,))]
            unclaimed = db.execute(
                "SELECT COUNT(DISTINCT o.series_uid) FROM objects o WHERE o.modality = 'CT' AND NOT EXISTS "
                "(SELECT 1 FROM patients p WHERE p.series_uid = o.series_uid) AND NOT EXISTS "
                "(SELECT 1 FROM patients p WHERE p.series_uid = '' AND p.frame_uid = o.frame_uid)").fetchone()[0]
            waiting, waiting_count = [], 0
            if self.version >= 4:  # earlier formats kept no schedule
                waiting = [dict(row) for row in db.execute(
                    "SELECT p.structure_set_uid, p.patient_id, p.next_send, p.send_until, p.send_attempts, "
                    "(SELECT COUNT(*) FROM sends s WHERE s.structure_set_uid = p.structure_set_uid) AS attempts, "
                    "(SELECT s.detail FROM sends s WHERE s.structure_set_uid = p.structure_set_uid AND s.outcome != ? "
                    "ORDER BY s.id DESC LIMIT 1) AS detail FROM patients p WHERE p.state = ? AND (p.next_send IS NOT "
                    "NULL OR p.send_attempts > 0) ORDER BY COALESCE(p.next_send, 0) LIMIT 20", (PENDING, PREDICTED))]
                waiting_count = db.execute("SELECT COUNT(*) FROM patients WHERE state = ? AND (next_send IS NOT NULL "
                                           "OR send_attempts > 0)", (PREDICTED,)).fetchone()[0]
            connections, latest_connections = 0, []
            if self.version >= 4:  # earlier formats kept none
                connections = db.execute("SELECT COALESCE(SUM(times), 0) FROM connections_refused").fetchone()[0]
                latest_connections = [dict(row) for row in db.execute(
                    "SELECT * FROM connections_refused ORDER BY last DESC LIMIT 5")]
            refusals, latest_refusals = 0, []
            if self.version >= 2:  # format 1 kept no refusals
                refusals = db.execute("SELECT COUNT(*) FROM refusals").fetchone()[0]
                latest_refusals = [dict(row) for row in db.execute(
                    "SELECT time, calling_ae, peer, sop_instance_uid, modality, patient_id, status, reason "
                    "FROM refusals ORDER BY id DESC LIMIT 5")]
        return {"objects": objects, "last_object": last_object, "states": states, "sends": sends,
                "recent": recent, "failed_sends": failed_sends, "ct_series_without_structure_set": unclaimed,
                "checked": sum(entry.get("inside") is not None for entry in checked),
                "outside": sum(entry.get("inside") is False for entry in checked),
                "predicted": len(checked),
                "uncommissioned": sum(entry.get("uncommissioned") is True for entry in checked),
                "above_ceiling": sum("dose_ceiling" in entry for entry in checked),
                "latest_uncommissioned": latest.get("uncommissioned") is True,
                "refusals": refusals, "latest_refusals": latest_refusals, "connections_refused": connections,
                "latest_connections_refused": latest_connections, "sends_waiting": waiting_count,
                "waiting": waiting}


def resend_lines(store: Path, wanted: str) -> tuple[list[str], bool]:
    """``openkbp-dicom serve --resend``: push the patients ``wanted`` names (:meth:`Journal.resend`)
    in the journal of the store folder ``store``; what was done, a line each, and whether any was
    pushed. A patient queued is said to go now when a node serves the store (holds its lock), and to
    wait for the node's start when none does."""
    path = Path(store) / JOURNAL_FILE
    if not path.is_file():
        raise JournalError(f"{path}: no journal here (is this a node's --store folder?)")
    journal = Journal(path)
    try:
        done = journal.resend(wanted)
    finally:
        journal.close()
    if not done:
        return [f"No patient with structure set UID or PatientID {printable(wanted)!r} in {path}"], False
    serving = is_held(Path(store) / LOCK_FILE)
    queued = {True: QUEUED, False: "queued, but no node serves this store now: nothing is sent until it starts",
              None: f"{QUEUED} (a running node sends it within a second, a stopped one at its start)"}[serving]
    lines = [f"Patient {printable(row['patient_id']) or '(no PatientID)'} (structure set {row['structure_set_uid']}): "
             f"{what.replace(QUEUED, queued)}" for row, what in done]
    return lines, any(QUEUED in what for _, what in done)


def summary_lines(journal: Journal) -> list[str]:
    """``openkbp-dicom serve --status``: the journal's summary as lines of text."""
    from provided_code.trust import OUTSIDE, UNCOMMISSIONED, flag_line  # here: the journal needs none of its imports

    summary = journal.summary()

    def when(seconds) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if seconds else "never"

    objects = summary["objects"]
    count = sum(n for n, _ in objects.values())
    size = sum(b for _, b in objects.values())
    kinds = ", ".join(f"{kind} {n}" for kind, (n, _) in sorted(objects.items()))
    lines = [f"Journal: {journal.path}",
             f"Objects received: {count}{f' ({kinds})' if kinds else ''}, {size / 1e6:.1f} MB; last "
             f"{when(summary['last_object'])}"]
    states = summary["states"]
    lines.append(f"Patients: {sum(states.values())}" + "".join(f", {state} {states[state]}" for state in STATES
                                                              if state in states))
    if summary["ct_series_without_structure_set"]:
        lines.append(f"CT series without a structure set: {summary['ct_series_without_structure_set']}")
    sends = summary["sends"]
    if sends:
        lines.append(f"Send attempts: {sum(sends.values())}" + "".join(f", {k} {v}" for k, v in sorted(sends.items())))
    if summary["sends_waiting"]:  # a send is under way (no next time yet) or scheduled
        lines.append(f"Sends waiting: {summary['sends_waiting']} (next attempt, attempts so far, gives up)")
    for row in summary["waiting"]:
        patient = printable(row["patient_id"]) or "(no PatientID)"
        last = f"; last: {row['detail']}" if row["send_attempts"] and row["detail"] else ""
        upcoming = when(row["next_send"]) if row["next_send"] is not None else "now (an attempt is under way)"
        until = when(row["send_until"]) if row["send_until"] else "not before its first failure"
        lines.append(f"  {patient} {row['structure_set_uid']}: next {upcoming}, {row['attempts']} "
                     f"attempt(s), gives up {until}{last}")
    for send in summary["failed_sends"]:
        lines.append(f"  {when(send['finished'])} attempt {send['attempt']} to {send['destination']} for structure "
                     f"set {send['structure_set_uid']}: {send['detail'] or 'interrupted'}")
    if summary["refusals"]:
        lines.append(f"Objects refused: {summary['refusals']}")
    for refusal in summary["latest_refusals"]:
        lines.append(f"  {when(refusal['time'])} {refusal['modality'] or 'object'} {refusal['sop_instance_uid']} of "
                     f"{refusal['patient_id'] or '(no PatientID)'} from {refusal['calling_ae']}, status "
                     f"0x{refusal['status']:04X}: {refusal['reason']}")
    if summary["connections_refused"]:
        lines.append(f"Connections and associations refused: {summary['connections_refused']}")
    for refused in summary["latest_connections_refused"]:
        who = f"{refused['calling_ae']} at {refused['peer']}" if refused["calling_ae"] else refused["peer"]
        times = f" ({refused['times']} times since {when(refused['first'])})" if refused["times"] > 1 else ""
        lines.append(f"  {when(refused['last'])} {refused['kind']} from {who}: {refused['reason']}{times}")
    if summary["uncommissioned"]:  # as the RT Dose's description and the patient's entry say it
        lines.append(f"{UNCOMMISSIONED[0].upper()}{UNCOMMISSIONED[1:]} (no bands, no in-distribution check): "
                     f"{summary['uncommissioned']} of the {summary['predicted']} patients predicted, "
                     f"{'the latest among them' if summary['latest_uncommissioned'] else 'not the latest'}")
    if summary["above_ceiling"]:
        lines.append(f"Predictions above the plausible ceiling (doses no plan gives): {summary['above_ceiling']} of "
                     f"the {summary['predicted']} patients predicted")
    if summary["checked"]:
        lines.append(f"Predictions {OUTSIDE}: {summary['outside']} of the {summary['checked']} checked")
    if summary["recent"]:
        lines.append("Latest patients (PatientID, state, structure set, reason):")
    for row in summary["recent"]:
        patient = printable(row["patient_id"]) or "(no PatientID)"
        reason = f": {row['reason']}" if row["reason"] else ""
        lines.append(f"  {when(row['updated'])} {patient} {row['state']} {row['structure_set_uid']}{reason}")
        trust = json.loads(row["trust"]) if row["trust"] else {}
        if trust.get("inside") is False:
            lines.append(f"    {flag_line(trust)}")
        if "dose_ceiling" in trust:
            said = AboveCeiling(**trust["dose_ceiling"]).line()
            lines.append(f"    {said[:1].upper()}{said[1:]}")
    return lines
