"""The send queue: the predicted patients whose RT Dose is to go to ``--send-to``, as a mail server
keeps its queue. The schedule is the journal's (``patients.next_send``): one thread sends the patient
due first, one at a time (``sender``), journals each attempt, and after a failed one schedules the
next after the back-off (doubling from ``--send-backoff`` up to ``sender.MAX_BACKOFF_S``), until
``--send-retry-hours`` have passed since its first failed attempt (``patients.send_until``); then
the patient fails, its RT Dose staying in the store. IT pushes a patient again from another process
(``openkbp-dicom serve --resend``, :meth:`Journal.resend`): the thread looks at the journal at least
every :data:`LOOK_S` seconds, so a push is sent within it, exactly once as any other send."""

from __future__ import annotations

import logging
import ssl
import threading
import time
from pathlib import Path
from typing import Callable

from provided_code.apps.node.journal import FAILED, FAILED_SEND, OK, PREDICTED, SENT, Journal
from provided_code.apps.node.sender import MAX_BACKOFF_S, Destination, backoff_delay, send_file
from provided_code.apps.node.text import duration, one_line

logger = logging.getLogger(__name__)

LOOK_S = 1.0  # the longest the send thread waits before it looks at the journal's schedule again


class SendQueue:
    """Sends each scheduled patient's ``rtdose_file`` (in its journaled result folder) to
    ``destination`` as ``calling_ae``; ``name(uid)`` is how log lines name a patient. A failed
    attempt is tried again after ``backoff`` (doubling, at most ``max_backoff``) for ``retry_for``
    seconds after the first that failed."""

    def __init__(self, journal: Journal, destination: Destination, calling_ae: str, rtdose_file: str,
                 name: Callable[[str], str], retry_for: float = 86400.0, backoff: float = 5.0, timeout: float = 60.0,
                 ssl_context: ssl.SSLContext | None = None, max_backoff: float = MAX_BACKOFF_S):
        self.journal, self.destination, self.calling_ae = journal, destination, calling_ae
        self.rtdose_file, self.name = rtdose_file, name
        self.retry_for, self.backoff, self.max_backoff = retry_for, backoff, max_backoff
        self.timeout, self.ssl_context = timeout, ssl_context
        self._wakeup = threading.Condition()

    def schedule(self, uid: str, due: float | None = None) -> None:
        """Send patient ``uid`` at ``due`` (now when None), or at the time it is already due if
        that is sooner: a patient is never queued twice."""
        self.journal.schedule_send(uid, time.time() if due is None else due)
        self.wake()

    def queued(self) -> dict[str, float]:
        """The patients waiting to be sent, and when each is due."""
        return self.journal.sends_waiting()

    def wake(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()

    def _next(self, stop: threading.Event) -> str | None:
        """The next patient due (waiting for it), or None once ``stop`` is set."""
        with self._wakeup:
            while not stop.is_set():
                due = self.journal.next_send()
                if due is not None and due[1] <= time.time():
                    return due[0]
                wait = due[1] - time.time() if due is not None else LOOK_S
                self._wakeup.wait(min(max(wait, 0.01), LOOK_S))
            return None

    def run(self, stop: threading.Event) -> None:
        """Send what is due until ``stop``."""
        while (uid := self._next(stop)) is not None:
            try:
                self._send(uid)
            except Exception as error:  # noqa: BLE001 - the journal itself failed; keep sending others
                logger.error("Patient %s: sending failed: %s", uid, one_line(error))
                stop.wait(LOOK_S)  # not at once again: the journal may stay broken

    def _send(self, uid: str) -> None:
        journal, destination = self.journal, self.destination
        row = journal.patient(uid)
        if row is None or row["state"] != PREDICTED:
            return
        send_id, attempt = journal.start_send(uid, str(destination))
        window = row["send_attempts"] + 1  # the attempts since it was predicted or pushed again: the back-off's
        try:
            detail = send_file(Path(row["output"]) / self.rtdose_file, destination, self.calling_ae,
                               self.ssl_context, timeout=self.timeout)
        except Exception as error:  # noqa: BLE001 - any failure is one failed attempt
            detail = one_line(error)
            journal.finish_send(send_id, FAILED_SEND, detail)
            now = time.time()
            give_up = journal.give_up_sending_at(uid, now + self.retry_for)
            if now >= give_up:
                counted = f"{window} attempts" if window == attempt else f"attempts {attempt - window + 1} to {attempt}"
                reason = (f"not sent to {destination} within {duration(self.retry_for)} of its first failed attempt "
                          f"({counted}; --send-retry-hours): {detail}")
                journal.transition(uid, FAILED, reason, expect=(PREDICTED,), failed_in="sending")
                logger.error("Patient %s failed: %s (openkbp-dicom serve --resend %s sends it again)", self.name(uid),
                             reason, uid)
                return
            due = min(now + backoff_delay(window, self.backoff, self.max_backoff), give_up)
            (logger.warning if window == 1 else logger.info)(
                "Patient %s: send attempt %d failed (%s); next in %s, retried until %s", self.name(uid), attempt,
                detail, duration(due - now), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(give_up)))
            self.schedule(uid, due)
            return
        journal.finish_send(send_id, OK, detail)
        journal.transition(uid, SENT, f"to {destination}, attempt {attempt}", expect=(PREDICTED,))
        logger.info("Patient %s: RT Dose sent to %s (attempt %d)", self.name(uid), destination, attempt)
