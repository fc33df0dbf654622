"""The patients' state machine (the states are the journal's): what each object received does to
its patient, when a patient is complete, its prediction, and where each patient stood at start.

- An object taken is journaled; a structure set makes a patient ``receiving`` (or tries a failed
  one again); a CT image tries again the failed patients of its series. A patient whose send had
  failed goes back to ``predicted`` and is handed to the send queue (``send(uid)``) at once.
- A patient becomes ``ready`` when every CT image it names is here and no open association is
  still delivering its objects (see ``readiness``); one worker predicts the ready patients one at
  a time with the node's predictor: its outputs are written into a staging folder and committed
  by one rename; the import's warnings go to the log and the patient's journal entry, and so does
  what the prediction says about itself (its bands' coverage; a patient outside the training
  cohort, a warning with the reasons; an uncommissioned model, which carries neither; a dose above
  the site's plausible ceiling, :mod:`provided_code.metrics.ceiling`).
- At start (:meth:`Patients.resume`): a patient caught ``predicting`` is predicted again (or is
  ``predicted`` if its outputs were committed), the ``ready`` ones are queued, the ``predicted``
  ones sent.
"""

from __future__ import annotations

import json
import logging
import queue
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from provided_code.apps.node.intake import Received
from provided_code.apps.node.journal import (
    FAILED,
    PREDICTED,
    PREDICTING,
    READY,
    RECEIVING,
    Journal,
)
from provided_code.apps.node.readiness import FAIL, decide
from provided_code.apps.node.store import Store
from provided_code.apps.node.text import one_line, printable
from provided_code.metrics.ceiling import AboveCeiling
from provided_code.trust import OUTSIDE, UNCOMMISSIONED, flag_line

logger = logging.getLogger(__name__)

class Patients:
    """The node's patients. ``predictor(ct_dir, rtstruct, out_dir, rtdose)`` writes a patient's
    outputs into ``out_dir`` and returns what it predicted with (``.used``: ``epoch <N>``), the import's
    ``.warnings``, the bands' nominal coverage (``.band``, None without) and the in-distribution
    check (``.in_distribution``, None without) and whether the model carries neither
    (``.uncommissioned``: its patients' journal entries say so); its ``rtdose_file`` names the RT Dose
    among the outputs. ``send(uid)`` hands a predicted patient to the send queue (None: the node sends
    nothing)."""

    def __init__(self, journal: Journal, store: Store, predictor: Callable, completion_timeout: float,
                 send: Callable[[str], None] | None = None):
        self.journal, self.store, self.predictor = journal, store, predictor
        self.completion_timeout = completion_timeout
        self.send = send
        self._lock = threading.RLock()
        self._open: dict[int, set[str]] = {}  # association -> series and frame UIDs it delivered
        self._queue: queue.Queue[str] = queue.Queue()

    def name(self, uid: str) -> str:
        """A patient as log lines name it: its PatientID and structure set."""
        row = self.journal.patient(uid)
        return _label(row["patient_id"] if row is not None else "", uid)

    # Receiving

    def received(self, association: int, obj: Received, path: Path, size: int, calling: str) -> None:
        """An object taken and written to ``path``: journaled, and what it does to its patient."""
        with self._lock:
            new = self.journal.add_object(
                sop_instance_uid=obj.sop_instance_uid, sop_class_uid=obj.sop_class_uid, modality=obj.modality,
                study_uid=obj.study_uid, series_uid=obj.series_uid, frame_uid=obj.frame_uid,
                patient_id=obj.patient_id, path=str(path), size=size, calling_ae=calling, own=obj.own)
            delivered = self._open.setdefault(association, set())
            delivered.update({obj.series_uid, obj.frame_uid} - {""})
            reopened = []
            if obj.references is not None:
                outcome = self.journal.add_structure_set(obj.sop_instance_uid, obj.patient_id, obj.study_uid,
                                                         obj.references)
                if obj.references.series_uids:
                    delivered.add(obj.references.series_uids[0])
                self._log_structure_set(obj, calling, outcome)
                reopened = [obj.sop_instance_uid] if outcome == "reopened" else []
            elif obj.modality == "CT":
                reopened = self.journal.reopen_failed(obj.series_uid, obj.frame_uid)
                for uid in reopened:
                    logger.info("Patient %s: CT images sent again: tried again", self.name(uid))
        for uid in reopened:  # only the send had failed: sent again now
            if self.send is not None and self.journal.patient(uid)["state"] == PREDICTED:
                self.send(uid)
        logger.debug("Stored %s %s from %s (%s)", obj.modality, obj.sop_instance_uid, calling,
                     "new" if new else "again")

    def _log_structure_set(self, obj: Received, calling: str, outcome: str) -> None:
        references = obj.references
        name = _label(obj.patient_id, obj.sop_instance_uid)
        if outcome == "new":
            wanted = (f"{len(references.images)} CT images of series {references.series_uids[0]}"
                      if references.images and references.series_uids else
                      f"{len(references.images)} CT images" if references.images else
                      f"the CT series of frame of reference {references.frame_uid}")
            logger.info("Patient %s from %s: waiting for %s", name, calling, wanted)
        elif outcome == "reopened":
            logger.info("Patient %s: sent again after a failure: tried again", name)
        else:
            logger.info("Patient %s: structure set received again; already %s", name, outcome)

    def closed(self, association: int, stopping: bool = False) -> None:
        """An association closed: its patients may be complete now (decided at the next start
        while the node is ``stopping``)."""
        with self._lock:
            delivered = self._open.pop(association, None)
        if delivered and not stopping:
            self.check()

    # Deciding

    def check(self) -> None:
        """Move every receiving patient that is complete to ``ready`` (and queue it); fail those
        incomplete for longer than the completion timeout."""
        now = time.time()
        with self._lock:
            busy = set().union(*self._open.values()) if self._open else set()
            for row in self.journal.patients(RECEIVING):
                uid = row["structure_set_uid"]
                status = self.journal.series_status(row)
                decision, reason = decide(status, now, self.completion_timeout,
                                          bool({row["frame_uid"], status.series_uid} & busy))
                if decision == READY:
                    if self.journal.transition(uid, READY, f"{status.slices} CT images of series {status.series_uid}",
                                               expect=(RECEIVING,), series_uid=status.series_uid):
                        logger.info("Patient %s: complete (%d CT images), queued for prediction", self.name(uid),
                                    status.slices)
                        self._queue.put(uid)
                elif decision == FAIL:
                    if self.journal.transition(uid, FAILED, reason, expect=(RECEIVING,), failed_in=RECEIVING):
                        logger.error("Patient %s failed: %s", self.name(uid), reason)

    def watch(self, stop: threading.Event) -> None:
        """Check the patients until ``stop`` (the completion timeout's clock)."""
        interval = min(1.0, max(self.completion_timeout / 4, 0.05))
        while not stop.wait(interval):
            try:
                self.check()
            except Exception as error:  # noqa: BLE001 - keep watching
                logger.error("Checking the patients failed: %s", one_line(error))

    # Predicting

    def wake(self) -> None:
        """Wake the worker (to see that the node stops)."""
        self._queue.put("")

    def work(self, stop: threading.Event) -> None:
        """Predict the ready patients one at a time until ``stop``."""
        while not stop.is_set():
            uid = self._queue.get()
            if not uid:
                continue
            try:
                self._predict(uid)
            except Exception as error:  # noqa: BLE001 - the journal itself failed; the next patient may not
                logger.error("Patient %s: %s", uid, one_line(error))

    def _predict(self, uid: str) -> None:
        journal = self.journal
        if not journal.transition(uid, PREDICTING, expect=(READY,)):
            return
        row = journal.patient(uid)
        name = self.name(uid)
        logger.info("Patient %s: predicting", name)
        start = time.perf_counter()
        staging = None
        try:
            rtdose = journal.reference_dose(row["frame_uid"])
            staging = self.store.staging_dir(uid)
            predicted = self.predictor(self.store.series_dir(row["series_uid"]), Path(journal.object_path(uid)),
                                       staging, Path(rtdose) if rtdose else None)
            final = self.store.commit_result(staging, uid)
            staging = None
        except Exception as error:  # noqa: BLE001 - a failed prediction fails the patient, not the node
            reason = f"prediction failed: {one_line(error, within=self.store.root)}"
            journal.transition(uid, FAILED, reason, expect=(PREDICTING,), failed_in=PREDICTING)
            logger.error("Patient %s failed: %s", name, reason)
            return
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        seconds = time.perf_counter() - start
        warnings = [printable(line, 400) for line in predicted.warnings]
        for line in warnings:
            logger.warning("Patient %s, import: %s", name, line)
        checked, band = predicted.in_distribution, predicted.band
        if checked is not None:
            (logger.info if checked["inside"] else logger.warning)("Patient %s: %s", name, flag_line(checked))
        trust = {"band": band, **({key: checked[key] for key in ("inside", "score", "p_value", "alpha", "threshold",
                                                                 "feature", "too_small", "reasons")}
                                  if checked is not None else {"inside": None}),
                 "uncommissioned": predicted.uncommissioned,
                 **({"dose_ceiling": predicted.dose_ceiling} if predicted.dose_ceiling is not None else {})}
        ceiling = AboveCeiling(**predicted.dose_ceiling) if predicted.dose_ceiling is not None else None
        journal.transition(uid, PREDICTED, f"{predicted.used}{', with the clinic RT Dose' if rtdose else ''}, "
                                           f"{seconds:.1f} s" + (f"; {len(warnings)} import warning(s)" if warnings
                                                                 else "")
                           + (f"; {100 * band:g} % bands" if band is not None else "")
                           + (f"; {OUTSIDE}" if checked is not None and not checked["inside"] else "")
                           + (f"; {UNCOMMISSIONED} (no bands, no in-distribution check)"
                              if predicted.uncommissioned else "")
                           + (f"; {ceiling.short()}" if ceiling is not None else ""),
                           expect=(PREDICTING,), output=str(final), send_attempts=0, warnings="\n".join(warnings),
                           trust=json.dumps(trust))
        logger.info("Patient %s: predicted in %.1f s: %s", name, seconds, final / self.predictor.rtdose_file)
        if self.send is not None:
            self.send(uid)

    # Resuming

    def resume(self) -> None:
        """Pick up each patient where the journal says it stood (see the module docstring)."""
        journal = self.journal
        interrupted = journal.close_interrupted_sends()
        for row in journal.patients(PREDICTING):
            uid = row["structure_set_uid"]
            final = self.store.result_dir(uid)
            if (final / self.predictor.rtdose_file).is_file():  # committed just before the stop
                journal.transition(uid, PREDICTED, "outputs committed before the node stopped", output=str(final),
                                   send_attempts=0)
            else:
                journal.transition(uid, READY, "the node stopped during its prediction: predicted again")
        to_predict = [row["structure_set_uid"] for row in journal.patients(READY)]
        for uid in to_predict:
            self._queue.put(uid)
        to_send = [row["structure_set_uid"] for row in journal.patients(PREDICTED)] if self.send is not None else []
        for uid in to_send:
            self.send(uid)
        waiting = len(journal.patients(RECEIVING))
        if to_predict or to_send or waiting or interrupted:
            logger.info("Resuming from the journal: %d patient(s) receiving, %d to predict, %d to send "
                        "(%d send attempt(s) interrupted)", waiting, len(to_predict), len(to_send), interrupted)


def _label(patient_id: str, structure_set_uid: str) -> str:
    """A patient as log lines name it: its PatientID (printable) and structure set."""
    return f"{printable(patient_id) or '(no PatientID)'} (structure set {structure_set_uid})"
