"""The node: a Storage SCP (with Verification) for CT, RT Structure Set, RT Plan and RT Dose, and
the threads that predict and send.

- Each C-STORE is checked (size limit, free-disk floor, decodable, UIDs of digits and dots, SOP
  class and instance as the request says), written whole into the store, journaled, then answered
  with success; anything else is answered with a DICOM failure status and one log line.
- A patient (a structure set) becomes ready when every CT image it names is here and no open
  association is still delivering its objects (see ``readiness``); one worker thread predicts
  the ready patients one at a time with the model loaded at start; its outputs are written into
  a staging folder and committed by one rename; a sender thread sends each RT Dose with back-off.
- At start the journal says where each patient stood: the node picks up from there.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import os
import queue
import shutil
import socketserver
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Callable

# Imported here, once, before any thread of the node runs: pydicom's modules import one another
# in a cycle that breaks when two threads import them for the first time together.
import pydicom.pixels  # noqa: F401
from pydicom.dataset import Dataset
from pydicom.uid import UID
from pynetdicom import ALL_TRANSFER_SYNTAXES, AE, evt
from pynetdicom.sop_class import Verification
from pynetdicom.transport import ThreadedAssociationServer

from provided_code.errors import UserError
from provided_code.apps.node.journal import (
    FAILED,
    FAILED_SEND,
    OK,
    PREDICTED,
    PREDICTING,
    READY,
    RECEIVING,
    SENT,
    Journal,
)
from provided_code.apps.node.readiness import FAIL, READY as DECIDED_READY, decide, structure_set_references
from provided_code.apps.node.sender import Destination, SendError, backoff_delay, client_ssl_context, send_file
from provided_code.apps.node.store import InvalidUIDError, Store, check_uid
from provided_code.infra.run_lock import RunLock

logger = logging.getLogger(__name__)

SOP_CLASSES = {
    "1.2.840.10008.5.1.4.1.1.2": "CT",
    "1.2.840.10008.5.1.4.1.1.481.3": "RTSTRUCT",
    "1.2.840.10008.5.1.4.1.1.481.5": "RTPLAN",
    "1.2.840.10008.5.1.4.1.1.481.2": "RTDOSE",
}
OUT_OF_RESOURCES = 0xA700
DATA_SET_MISMATCH = 0xA900
CANNOT_UNDERSTAND = 0xC000
PROCESSING_FAILURE = 0x0110
OWN_MANUFACTURER = "provided_code"  # what the RT Doses this project writes say (rtdose.write_rtdose)
RESULT_RTDOSE = "RD.dcm"
MAX_PDU = 256 * 1024
# Tests only: while the file this names exists, the worker waits after writing a prediction's
# outputs and before committing them (so that a test can kill the node mid-prediction).
HOLD_VARIABLE = "OPENKBP_NODE_TEST_HOLD"


@dataclasses.dataclass
class NodeSettings:
    store: Path
    ae_title: str = "KBP"
    host: str = "0.0.0.0"
    port: int = 11112
    send_to: Destination | None = None
    allow: tuple[str, ...] = ()  # calling AE titles; empty: any
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None  # with it: clients must show a certificate it signed, and sends go over TLS
    completion_timeout: float = 600.0  # s without a new object before an incomplete patient fails
    max_object_bytes: int = 2 * 1024**3
    min_free_bytes: int = 1024**3
    send_attempts: int = 10
    send_backoff: float = 5.0  # s before the second attempt; doubling, at most sender.MAX_BACKOFF_S
    network_timeout: float = 60.0
    max_associations: int = 10


class Refusal(Exception):
    """A C-STORE answered with a failure status: ``status`` and a short ``comment``."""

    def __init__(self, status: int, comment: str):
        super().__init__(comment)
        self.status, self.comment = status, comment


def _text(value) -> str:
    return "" if value is None else str(value).strip()


def _printable(value, limit: int = 64) -> str:
    """Tag text for a log line: control characters replaced, at most ``limit`` characters."""
    text = "".join(c if c.isprintable() else "?" for c in _text(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _one_line(error: BaseException) -> str:
    text = str(error) if isinstance(error, (UserError, OSError)) else f"{type(error).__name__}: {error}"
    return " ".join(text.split())


def _check_pixel_data(dataset, transfer_syntax) -> None:
    """A CT image's pixel data is there and, uncompressed, as long as its rows, columns and bits say
    (a truncated object is refused now rather than failing its patient later)."""
    try:
        pixels = dataset.get("PixelData")
        shape = [int(dataset.get(tag) or 0) for tag in ("Rows", "Columns", "BitsAllocated")]
        frames, samples = int(dataset.get("NumberOfFrames") or 1), int(dataset.get("SamplesPerPixel") or 1)
    except (TypeError, ValueError):
        raise Refusal(CANNOT_UNDERSTAND, "CT image with unreadable image attributes") from None
    if not pixels or not all(shape):
        raise Refusal(CANNOT_UNDERSTAND, "CT image without pixel data, rows, columns or bits")
    if not UID(transfer_syntax).is_compressed:
        expected = shape[0] * shape[1] * (shape[2] // 8) * frames * samples
        if not expected <= len(pixels) <= expected + 1:
            raise Refusal(CANNOT_UNDERSTAND, f"pixel data of {len(pixels)} bytes, expected {expected}")


def server_ssl_context(cert: os.PathLike | str, key: os.PathLike | str,
                       ca: os.PathLike | str | None = None) -> ssl.SSLContext:
    """TLS for incoming associations (TLS 1.2 or newer); with ``ca``, clients must present a
    certificate signed by it."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    if ca is not None:
        context.load_verify_locations(str(ca))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class _Server(ThreadedAssociationServer):
    """pynetdicom's server with the TLS handshake moved from the accept loop (where one client that
    never completes it would hold up every other) into the association's own thread, bounded by
    ``handshake_timeout``; and its errors as one log line rather than a traceback."""

    handshake_timeout = 30.0

    def get_request(self):
        client, address = self.socket.accept()
        if self.ssl_context:
            client = self.ssl_context.wrap_socket(client, server_side=True, do_handshake_on_connect=False)
        return client, address

    def process_request_thread(self, request, client_address):
        if isinstance(request, ssl.SSLSocket):
            try:
                request.settimeout(self.handshake_timeout)
                request.do_handshake()
                request.settimeout(None)
            except (OSError, ValueError) as error:
                logger.warning("TLS handshake with %s failed: %s", client_address[0], _one_line(error))
                self.shutdown_request(request)
                return
        super().process_request_thread(request, client_address)

    def handle_error(self, request, client_address):
        logger.error("Connection from %s failed: %s", client_address[0], _one_line(sys.exc_info()[1]))

    def shutdown(self):
        socketserver.BaseServer.shutdown(self)
        self.server_close()
        for assoc in list(self.active_associations):
            assoc.abort()


def start_server(ae, address: tuple[str, int], handlers: list, ssl_context: ssl.SSLContext | None = None,
                 handshake_timeout: float = 30.0):
    """Serve ``ae`` on ``address`` in a thread of its own (see :class:`_Server`); ``shutdown()`` stops it
    within a tenth of a second."""
    server = ae.make_server(address, ssl_context=ssl_context, evt_handlers=handlers, server_class=_Server)
    server.handshake_timeout = handshake_timeout
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="node-accept",
                              daemon=True)
    thread.start()
    return server


class Node:
    """A running node (``start``/``stop``, or a ``with`` block). ``predictor(ct_dir, rtstruct,
    out_dir, rtdose)`` writes a patient's outputs into ``out_dir`` (see ``predictor``)."""

    def __init__(self, settings: NodeSettings, predictor: Callable):
        self.settings = settings
        self.predictor = predictor
        self.store = Store(settings.store)
        self.journal: Journal | None = None
        self._lock = threading.RLock()
        self._open: dict[int, set[str]] = {}  # association -> series and frame UIDs it delivered
        self._predictions: queue.Queue[str] = queue.Queue()
        self._sends: list[tuple[float, int, str]] = []
        self._send_order = itertools.count()
        self._send_wakeup = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server = None
        self._lock_file: RunLock | None = None
        self._send_ssl = (client_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
                          if settings.tls_ca is not None else None)

    # Life

    def start(self) -> "Node":
        self._lock_file = RunLock(self.store.root / ".lock", "a DICOM node", advice="stop it, or give this node another --store")
        self._lock_file.__enter__()  # one node per store, released by stop() or by the process's end
        removed = self.store.clean_temporaries()
        if removed:
            logger.info("Removed %d half-written file(s) an earlier run left in %s", removed, self.store.root)
        self.journal = Journal(self.store.journal_path)
        self._resume()
        self._server = self._start_server()
        for target, name in ((self._predict_loop, "predict"), (self._send_loop, "send"), (self._watch_loop, "watch")):
            thread = threading.Thread(target=target, name=f"node-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("Listening as %s on %s:%d%s; store %s%s", self.settings.ae_title, self.settings.host, self.port,
                    " (TLS)" if self.settings.tls_cert else "", self.store.root,
                    f"; answers go to {self.settings.send_to}" if self.settings.send_to else "")
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def stop(self, timeout: float = 60.0) -> None:
        """Stop listening, let a running prediction finish (up to ``timeout``), close the journal."""
        self._stop.set()
        self._predictions.put("")  # wakes the worker
        if self._server is not None:
            self._server.shutdown()
        with self._send_wakeup:
            self._send_wakeup.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        if self.journal is not None and not any(thread.is_alive() for thread in self._threads):
            self.journal.close()
            self._lock_file.__exit__(None, None, None)

    def __enter__(self) -> "Node":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _resume(self) -> None:
        """Pick up each patient where the journal says it stood."""
        journal = self.journal
        interrupted = journal.close_interrupted_sends()
        for row in journal.patients(PREDICTING):
            uid = row["structure_set_uid"]
            final = self.store.result_dir(uid)
            if (final / RESULT_RTDOSE).is_file():  # committed just before the stop
                journal.transition(uid, PREDICTED, "outputs committed before the node stopped", output=str(final),
                                   send_attempts=0)
            else:
                journal.transition(uid, READY, "the node stopped during its prediction: predicted again")
        to_predict = [row["structure_set_uid"] for row in journal.patients(READY)]
        for uid in to_predict:
            self._predictions.put(uid)
        to_send = [row["structure_set_uid"] for row in journal.patients(PREDICTED)] if self.settings.send_to else []
        for uid in to_send:
            self._schedule_send(uid, time.time())
        waiting = len(journal.patients(RECEIVING))
        if to_predict or to_send or waiting or interrupted:
            logger.info("Resuming from the journal: %d patient(s) receiving, %d to predict, %d to send "
                        "(%d send attempt(s) interrupted)", waiting, len(to_predict), len(to_send), interrupted)

    def _start_server(self):
        settings = self.settings
        ae = AE(ae_title=settings.ae_title)
        ae.add_supported_context(Verification)
        for sop_class in SOP_CLASSES:
            ae.add_supported_context(UID(sop_class), ALL_TRANSFER_SYNTAXES)
        ae.require_called_aet = True
        ae.require_calling_aet = list(settings.allow)
        ae.maximum_associations = settings.max_associations
        ae.maximum_pdu_size = MAX_PDU
        ae.acse_timeout = ae.dimse_timeout = ae.network_timeout = settings.network_timeout
        handlers = [(evt.EVT_C_ECHO, self._on_echo), (evt.EVT_C_STORE, self._on_store),
                    (evt.EVT_CONN_CLOSE, self._on_close), (evt.EVT_REJECTED, self._on_rejected)]
        context = (server_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
                   if settings.tls_cert is not None else None)
        return start_server(ae, (settings.host, settings.port), handlers, context, settings.network_timeout)

    # Receiving

    def _on_echo(self, event) -> int:
        return 0x0000

    def _on_rejected(self, event) -> None:
        requestor = event.assoc.requestor
        calling, called = _text(requestor.ae_title), _text(getattr(requestor.primitive, "called_ae_title", ""))
        if self.settings.allow and calling not in self.settings.allow:
            why = f"calling AE title {_printable(calling)!r} is not in --allow"
        elif called != self.settings.ae_title:
            why = f"called AE title {_printable(called)!r} is not {self.settings.ae_title!r}"
        else:
            why = "refused by pynetdicom (see --verbose)"
        logger.warning("Refused an association from %s: %s", requestor.address, why)

    def _on_close(self, event) -> None:
        with self._lock:
            delivered = self._open.pop(id(event.assoc), None)
        if delivered and not self._stop.is_set():  # while stopping: decided at the next start
            self._check_patients()

    def _on_store(self, event):
        calling = _printable(event.assoc.requestor.ae_title)
        try:
            self._receive(event, calling)
            return 0x0000
        except Refusal as refusal:
            status, comment = refusal.status, refusal.comment
        except OSError as error:  # the disk: full, gone, read-only
            status, comment = OUT_OF_RESOURCES, f"cannot write the object: {_one_line(error)}"
        except Exception as error:  # noqa: BLE001 - a bad object must not stop the node
            status, comment = PROCESSING_FAILURE, f"cannot store the object: {_one_line(error)}"
        logger.warning("Refused a C-STORE from %s (%s), status 0x%04X: %s", calling,
                       _printable(event.request.AffectedSOPInstanceUID), status, comment)
        answer = Dataset()
        answer.Status = status
        answer.ErrorComment = comment[:64]
        return answer

    def _receive(self, event, calling: str) -> None:
        settings = self.settings
        request = event.request
        size = request.DataSet.getbuffer().nbytes
        if size > settings.max_object_bytes:
            raise Refusal(OUT_OF_RESOURCES, f"object of {size / 1e6:.1f} MB over the limit of "
                                            f"{settings.max_object_bytes / 1e6:.1f} MB")
        free = self.store.free_bytes()
        if free - size < settings.min_free_bytes:
            raise Refusal(OUT_OF_RESOURCES,
                          f"free disk {free / 1e6:.0f} MB, floor {settings.min_free_bytes / 1e6:.0f} MB")
        try:
            dataset = event.dataset
            sop_class, sop_instance = _text(dataset.get("SOPClassUID")), _text(dataset.get("SOPInstanceUID"))
            series, study = _text(dataset.get("SeriesInstanceUID")), _text(dataset.get("StudyInstanceUID"))
            frame, patient_id = _text(dataset.get("FrameOfReferenceUID")), _text(dataset.get("PatientID"))
            manufacturer = _text(dataset.get("Manufacturer"))
        except Exception as error:  # noqa: BLE001 - pydicom fails in many ways on broken bytes
            raise Refusal(CANNOT_UNDERSTAND, f"cannot decode the data set ({type(error).__name__})") from None
        if sop_class != _text(request.AffectedSOPClassUID):
            raise Refusal(DATA_SET_MISMATCH, "SOPClassUID differs from the request's")
        if sop_instance != _text(request.AffectedSOPInstanceUID):
            raise Refusal(DATA_SET_MISMATCH, "SOPInstanceUID differs from the request's")
        modality = SOP_CLASSES.get(sop_class)
        if modality is None:  # only if a context was accepted for another class; pynetdicom refuses those
            raise Refusal(0x0122, "SOP class not supported")
        for value, what in ((sop_instance, "SOPInstanceUID"), (series, "SeriesInstanceUID"),
                            (study, "StudyInstanceUID"), (frame, "FrameOfReferenceUID")):
            try:
                if value or what != "FrameOfReferenceUID":
                    check_uid(value, what)
            except InvalidUIDError:
                raise Refusal(CANNOT_UNDERSTAND, f"invalid {what} (digits and dots only)") from None
        if modality == "CT":
            if not frame:
                raise Refusal(CANNOT_UNDERSTAND, "CT image without FrameOfReferenceUID")
            _check_pixel_data(dataset, event.context.transfer_syntax)
        references = None
        if modality == "RTSTRUCT":
            try:
                references = structure_set_references(dataset)
                check_uid(references.frame_uid, "FrameOfReferenceUID")
            except (ValueError, InvalidUIDError) as error:
                raise Refusal(CANNOT_UNDERSTAND, _one_line(error)) from None
            frame = references.frame_uid
        path = self.store.write_object(series, sop_instance, event.encoded_dataset())
        with self._lock:
            new = self.journal.add_object(
                sop_instance_uid=sop_instance, sop_class_uid=sop_class, modality=modality, study_uid=study,
                series_uid=series, frame_uid=frame, patient_id=patient_id, path=str(path), size=size,
                calling_ae=calling, own=modality == "RTDOSE" and manufacturer == OWN_MANUFACTURER)
            self._open.setdefault(id(event.assoc), set()).update({series, frame} - {""})
            if references is not None:
                outcome = self.journal.add_structure_set(sop_instance, patient_id, study, references)
                if references.series_uids:
                    self._open[id(event.assoc)].add(references.series_uids[0])
                self._log_structure_set(sop_instance, patient_id, calling, references, outcome)
            elif modality == "CT":
                for uid in self.journal.reopen_failed(series, frame):
                    logger.info("Patient %s: CT images sent again: tried again", self._name(uid))
        logger.debug("Stored %s %s from %s (%s)", modality, sop_instance, calling, "new" if new else "again")

    def _log_structure_set(self, uid: str, patient_id: str, calling: str, references, outcome: str) -> None:
        name = f"{_printable(patient_id) or '(no PatientID)'} (structure set {uid})"
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

    def _name(self, uid: str) -> str:
        row = self.journal.patient(uid)
        patient_id = _printable(row["patient_id"]) if row is not None else ""
        return f"{patient_id or '(no PatientID)'} (structure set {uid})"

    # Deciding

    def _check_patients(self) -> None:
        """Move every receiving patient that is complete to ``ready`` (and queue it); fail those
        incomplete for longer than the completion timeout."""
        now = time.time()
        with self._lock:
            busy = set().union(*self._open.values()) if self._open else set()
            for row in self.journal.patients(RECEIVING):
                uid = row["structure_set_uid"]
                status = self.journal.series_status(row)
                decision, reason = decide(status, now, self.settings.completion_timeout,
                                          bool({row["frame_uid"], status.series_uid} & busy))
                if decision == DECIDED_READY:
                    if self.journal.transition(uid, READY, f"{status.slices} CT images of series {status.series_uid}",
                                               expect=(RECEIVING,), series_uid=status.series_uid):
                        logger.info("Patient %s: complete (%d CT images), queued for prediction", self._name(uid),
                                    status.slices)
                        self._predictions.put(uid)
                elif decision == FAIL:
                    if self.journal.transition(uid, FAILED, reason, expect=(RECEIVING,), failed_in=RECEIVING):
                        logger.error("Patient %s failed: %s", self._name(uid), reason)

    def _watch_loop(self) -> None:
        interval = min(1.0, max(self.settings.completion_timeout / 4, 0.05))
        while not self._stop.wait(interval):
            try:
                self._check_patients()
            except Exception as error:  # noqa: BLE001 - keep watching
                logger.error("Checking the patients failed: %s", _one_line(error))

    # Predicting

    def _predict_loop(self) -> None:
        while not self._stop.is_set():
            uid = self._predictions.get()
            if not uid:
                continue
            try:
                self._predict(uid)
            except Exception as error:  # noqa: BLE001 - the journal itself failed; the next patient may not
                logger.error("Patient %s: %s", uid, _one_line(error))

    def _predict(self, uid: str) -> None:
        journal = self.journal
        if not journal.transition(uid, PREDICTING, expect=(READY,)):
            return
        row = journal.patient(uid)
        name = self._name(uid)
        logger.info("Patient %s: predicting", name)
        start = time.perf_counter()
        staging = None
        try:
            rtdose = journal.reference_dose(row["frame_uid"])
            staging = self.store.staging_dir(uid)
            epoch = self.predictor(self.store.series_dir(row["series_uid"]), Path(journal.object_path(uid)), staging,
                                   Path(rtdose) if rtdose else None)
            self._hold_for_tests()
            final = self.store.commit_result(staging, uid)
            staging = None
        except Exception as error:  # noqa: BLE001 - a failed prediction fails the patient, not the node
            reason = f"prediction failed: {_one_line(error)}"
            journal.transition(uid, FAILED, reason, expect=(PREDICTING,), failed_in=PREDICTING)
            logger.error("Patient %s failed: %s", name, reason)
            return
        finally:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
        seconds = time.perf_counter() - start
        journal.transition(uid, PREDICTED, f"epoch {epoch}{', with the clinic RT Dose' if rtdose else ''}, "
                                           f"{seconds:.1f} s", expect=(PREDICTING,), output=str(final), send_attempts=0)
        logger.info("Patient %s: predicted in %.1f s: %s", name, seconds, final / RESULT_RTDOSE)
        if self.settings.send_to is not None:
            self._schedule_send(uid, time.time())

    def _hold_for_tests(self) -> None:
        hold = os.environ.get(HOLD_VARIABLE)
        while hold and os.path.exists(hold) and not self._stop.is_set():
            time.sleep(0.05)

    # Sending

    def _schedule_send(self, uid: str, due: float) -> None:
        with self._send_wakeup:
            heapq.heappush(self._sends, (due, next(self._send_order), uid))
            self._send_wakeup.notify()

    def _send_loop(self) -> None:
        while True:
            with self._send_wakeup:
                while not self._stop.is_set() and (not self._sends or self._sends[0][0] > time.time()):
                    wait = self._sends[0][0] - time.time() if self._sends else 1.0
                    self._send_wakeup.wait(min(max(wait, 0.01), 1.0))
                if self._stop.is_set():
                    return
                _, _, uid = heapq.heappop(self._sends)
            try:
                self._send(uid)
            except Exception as error:  # noqa: BLE001 - the journal itself failed; keep sending others
                logger.error("Patient %s: sending failed: %s", uid, _one_line(error))

    def _send(self, uid: str) -> None:
        journal, destination = self.journal, self.settings.send_to
        row = journal.patient(uid)
        if row is None or row["state"] != PREDICTED:
            return
        send_id, attempt = journal.start_send(uid, str(destination))
        try:
            detail = send_file(Path(row["output"]) / RESULT_RTDOSE, destination, self.settings.ae_title,
                               self._send_ssl, timeout=self.settings.network_timeout)
        except Exception as error:  # noqa: BLE001 - any failure is one failed attempt
            detail = _one_line(error) if isinstance(error, SendError) else f"{type(error).__name__}: {error}"
            journal.finish_send(send_id, FAILED_SEND, detail)
            if attempt >= self.settings.send_attempts:
                reason = f"not sent to {destination} after {attempt} attempts: {detail}"
                journal.transition(uid, FAILED, reason, expect=(PREDICTED,), failed_in="sending")
                logger.error("Patient %s failed: %s", self._name(uid), reason)
            else:
                delay = backoff_delay(attempt, self.settings.send_backoff)
                logger.warning("Patient %s: send attempt %d failed (%s); next in %g s", self._name(uid), attempt,
                               detail, delay)
                self._schedule_send(uid, time.time() + delay)
            return
        journal.finish_send(send_id, OK, detail)
        journal.transition(uid, SENT, f"to {destination}, attempt {attempt}", expect=(PREDICTED,))
        logger.info("Patient %s: RT Dose sent to %s (attempt %d)", self._name(uid), destination, attempt)
