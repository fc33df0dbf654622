"""The send queue: the predicted patients whose RT Dose is to go to ``--send-to``, each at most once
in the queue, at its due time; one thread sends them one at a time (``sender``), journals each
attempt, and after a failed one schedules the next after the back-off, until the attempts run out
and the patient fails (its RT Dose stays in the store)."""

from __future__ import annotations

import heapq
import itertools
import logging
import ssl
import threading
import time
from pathlib import Path
from typing import Callable

from provided_code.apps.node.journal import FAILED, FAILED_SEND, OK, PREDICTED, SENT, Journal
from provided_code.apps.node.sender import Destination, backoff_delay, send_file
from provided_code.apps.node.text import one_line

logger = logging.getLogger(__name__)


class SendQueue:
    """Sends each scheduled patient's ``rtdose_file`` (in its journaled result folder) to
    ``destination`` as ``calling_ae``; ``name(uid)`` is how log lines name a patient."""

    def __init__(self, journal: Journal, destination: Destination, calling_ae: str, rtdose_file: str,
                 name: Callable[[str], str], attempts: int = 10, backoff: float = 5.0, timeout: float = 60.0,
                 ssl_context: ssl.SSLContext | None = None):
        self.journal, self.destination, self.calling_ae = journal, destination, calling_ae
        self.rtdose_file, self.name = rtdose_file, name
        self.attempts, self.backoff, self.timeout, self.ssl_context = attempts, backoff, timeout, ssl_context
        self._heap: list[tuple[float, int, str]] = []
        self._due: dict[str, float] = {}  # patient -> when it is due; the heap's other entries for it are stale
        self._order = itertools.count()
        self._wakeup = threading.Condition()

    def schedule(self, uid: str, due: float | None = None) -> None:
        """Send patient ``uid`` at ``due`` (now when None), or at the time it is already due if
        that is sooner: a patient is never queued twice."""
        due = time.time() if due is None else due
        with self._wakeup:
            if uid in self._due and self._due[uid] <= due:
                return
            self._due[uid] = due
            heapq.heappush(self._heap, (due, next(self._order), uid))
            self._wakeup.notify()

    def queued(self) -> dict[str, float]:
        """The patients waiting to be sent, and when each is due."""
        with self._wakeup:
            return dict(self._due)

    def wake(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()

    def _next(self, stop: threading.Event) -> str | None:
        """The next patient due (waiting for it), or None once ``stop`` is set."""
        with self._wakeup:
            while not stop.is_set():
                while self._heap and self._due.get(self._heap[0][2]) != self._heap[0][0]:
                    heapq.heappop(self._heap)  # stale: scheduled sooner since
                if self._heap and self._heap[0][0] <= time.time():
                    _, _, uid = heapq.heappop(self._heap)
                    del self._due[uid]
                    return uid
                wait = self._heap[0][0] - time.time() if self._heap else 1.0
                self._wakeup.wait(min(max(wait, 0.01), 1.0))
            return None

    def run(self, stop: threading.Event) -> None:
        """Send what is due until ``stop``."""
        while (uid := self._next(stop)) is not None:
            try:
                self._send(uid)
            except Exception as error:  # noqa: BLE001 - the journal itself failed; keep sending others
                logger.error("Patient %s: sending failed: %s", uid, one_line(error))

    def _send(self, uid: str) -> None:
        journal, destination = self.journal, self.destination
        row = journal.patient(uid)
        if row is None or row["state"] != PREDICTED:
            return
        send_id, attempt = journal.start_send(uid, str(destination))
        try:
            detail = send_file(Path(row["output"]) / self.rtdose_file, destination, self.calling_ae,
                               self.ssl_context, timeout=self.timeout)
        except Exception as error:  # noqa: BLE001 - any failure is one failed attempt
            detail = one_line(error)
            journal.finish_send(send_id, FAILED_SEND, detail)
            if attempt >= self.attempts:
                reason = f"not sent to {destination} after {attempt} attempts: {detail}"
                journal.transition(uid, FAILED, reason, expect=(PREDICTED,), failed_in="sending")
                logger.error("Patient %s failed: %s", self.name(uid), reason)
            else:
                delay = backoff_delay(attempt, self.backoff)
                logger.warning("Patient %s: send attempt %d failed (%s); next in %g s", self.name(uid), attempt,
                               detail, delay)
                self.schedule(uid, time.time() + delay)
            return
        journal.finish_send(send_id, OK, detail)
        journal.transition(uid, SENT, f"to {destination}, attempt {attempt}", expect=(PREDICTED,))
        logger.info("Patient %s: RT Dose sent to %s (attempt %d)", self.name(uid), destination, attempt)
