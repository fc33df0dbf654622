"""The node's transport: a Storage SCP (with Verification) for CT, RT Structure Set, RT Plan and RT
Dose on pynetdicom, and the :class:`Node` that wires it to the intake checks (``intake``), the
store, the patients' state machine (``patients``) and the send queue (``send_queue``).

- A connection has ``--acse-timeout`` seconds to finish its TLS handshake and start its association
  request; until it does it is no association (it counts against no limit, costs one waiting
  thread), and at most ``--max-pending`` such connections are kept: beyond, the oldest is closed.
  At most ``--max-associations`` associations are served at once; one more is rejected (transient,
  local limit exceeded) and logged with its address. An association silent for ``--network-timeout``
  seconds is aborted.
- Each C-STORE is checked (``intake``), written whole into the store, journaled, then answered
  with success; anything else is answered with a DICOM failure status, journaled as a refusal and
  logged in one line naming the object's patient.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import socket
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

from provided_code.apps.node.intake import (
    OUT_OF_RESOURCES,
    PROCESSING_FAILURE,
    SOP_CLASSES,
    SUCCESS,
    Refusal,
    check_room,
    examine,
    named_in,
)
from provided_code.apps.node.journal import Journal
from provided_code.apps.node.patients import Patients
from provided_code.apps.node.reactor import WaitingRequestHandler
from provided_code.apps.node.send_queue import SendQueue
from provided_code.apps.node.sender import Destination, client_ssl_context
from provided_code.apps.node.store import Store
from provided_code.apps.node.text import one_line, printable, text_of
from provided_code.infra.run_lock import RunLock

logger = logging.getLogger(__name__)

MAX_PDU = 256 * 1024
LOCAL_LIMIT_EXCEEDED = (0x02, 0x03, 0x02)  # A-ASSOCIATE-RJ: transient, presentation-related, local limit exceeded


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
    network_timeout: float = 60.0  # s an association may be silent (and a send wait for an answer)
    acse_timeout: float = 10.0  # s a connection has to finish its TLS handshake and request an association
    max_associations: int = 20  # associations served at once
    max_pending: int = 100  # connections at once that have not requested an association yet


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


def _peer(address) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


class _Server(ThreadedAssociationServer):
    """pynetdicom's server, with each connection held in its own thread until it starts its
    association request (see the module docstring): the TLS handshake moved there from the accept
    loop, where one client that never completes it would hold up every other; and its errors as one
    log line rather than a traceback."""

    acse_timeout: float  # set by start_server
    max_pending: int

    def get_request(self):
        client, address = self.socket.accept()
        if self.ssl_context:
            client = self.ssl_context.wrap_socket(client, server_side=True, do_handshake_on_connect=False)
        return client, address

    def process_request_thread(self, request, client_address):
        if not self._await_association(request, client_address):
            self.shutdown_request(request)
            return
        super().process_request_thread(request, client_address)

    def server_bind(self):
        super().server_bind()
        self._waiting: dict[socket.socket, float] = {}  # connections not associated yet -> since when
        self._waiting_lock = threading.Lock()

    def _await_association(self, request, address) -> bool:
        """Whether the connection starts its association request within ``acse_timeout`` (its TLS
        handshake first); while it waits, one of at most ``max_pending``."""
        waiting = self._waiting
        with self._waiting_lock:
            evicted = None
            if len(waiting) >= self.max_pending:
                evicted = min(waiting, key=waiting.get)
                del waiting[evicted]
            waiting[request] = time.monotonic()
        if evicted is not None:
            logger.warning("Closed a connection from %s that had not requested an association: %d connections "
                           "waiting, the most --max-pending allows", _peer(_address_of(evicted)), self.max_pending)
            _close_socket(evicted)
        deadline = time.monotonic() + self.acse_timeout
        try:
            if isinstance(request, ssl.SSLSocket):
                try:
                    request.settimeout(self.acse_timeout)
                    request.do_handshake()
                    request.settimeout(None)
                except (OSError, ValueError) as error:
                    if self._still_waiting(request):
                        logger.warning("TLS handshake with %s failed: %s", _peer(address), one_line(error))
                    return False
                if request.pending():
                    return self._still_waiting(request)
            poller = select.poll()  # not select.select: its descriptors stop at 1024
            poller.register(request, select.POLLIN)
            readable = poller.poll(max(deadline - time.monotonic(), 0) * 1000)
            if not self._still_waiting(request):
                return False  # closed to make room (logged by whom closed it)
            if not readable:
                logger.info("Closed a connection from %s: no association request within %g s (--acse-timeout)",
                            _peer(address), self.acse_timeout)
                return False
            if not isinstance(request, ssl.SSLSocket) and not request.recv(1, socket.MSG_PEEK):
                return False  # closed by the client before a word
            return True
        except (OSError, ValueError):
            return False  # closed (by the client, or to make room)
        finally:
            with self._waiting_lock:
                waiting.pop(request, None)

    def _still_waiting(self, request) -> bool:
        with self._waiting_lock:
            return request in self._waiting

    def handle_error(self, request, client_address):
        logger.error("Connection from %s failed: %s", _peer(client_address), one_line(sys.exc_info()[1]))

    def shutdown(self):
        socketserver.BaseServer.shutdown(self)
        self.server_close()
        with self._waiting_lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for request in waiting:
            _close_socket(request)
        for assoc in list(self.active_associations):
            assoc.abort()


def _address_of(sock) -> tuple | str:
    try:
        return sock.getpeername()
    except OSError:
        return "(gone)"


def _close_socket(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def start_server(ae, address: tuple[str, int], handlers: list, ssl_context: ssl.SSLContext | None = None,
                 acse_timeout: float = 30.0, max_pending: int = 100):
    """Serve ``ae`` on ``address`` in a thread of its own (see :class:`_Server`), each association's
    threads waiting rather than polling (``reactor``); ``shutdown()`` stops it within a tenth of a second."""
    server = ae.make_server(address, ssl_context=ssl_context, evt_handlers=handlers, server_class=_Server,
                            request_handler=WaitingRequestHandler)
    server.acse_timeout, server.max_pending = acse_timeout, max_pending
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="node-accept",
                              daemon=True)
    thread.start()
    return server


class Node:
    """A running node (``start``/``stop``, or a ``with`` block). ``predictor``: see
    :class:`~provided_code.apps.node.patients.Patients`."""

    def __init__(self, settings: NodeSettings, predictor: Callable):
        self.settings = settings
        self.predictor = predictor
        self.store = Store(settings.store)
        self.journal: Journal | None = None
        self.patients: Patients | None = None
        self.sends: SendQueue | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server = None
        self._lock_file: RunLock | None = None

    # Life

    def start(self) -> "Node":
        """Take the store, resume its patients, listen and start the workers; a failure on the way
        (the port taken, a TLS file, a damaged journal) undoes what was done (the lock, the journal, the
        threads) before it is raised, so that the same process may start a node on the store again."""
        try:
            return self._start()
        except BaseException:
            self.stop(timeout=10.0)
            raise

    def _start(self) -> "Node":
        settings = self.settings
        self._lock_file = RunLock(self.store.root / ".lock", "a DICOM node", advice="stop it, or give this node another --store")
        self._lock_file.__enter__()  # one node per store, released by stop() or by the process's end
        self.store.owner_only(self._lock_file.path)
        removed = self.store.clean_temporaries()
        if removed:
            logger.info("Removed %d half-written file(s) an earlier run left in %s", removed, self.store.root)
        self.journal = Journal(self.store.journal_path)
        if settings.send_to is not None:
            send_ssl = (client_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
                        if settings.tls_ca is not None else None)
            self.sends = SendQueue(self.journal, settings.send_to, settings.ae_title, self.predictor.rtdose_file,
                                   self._name, settings.send_attempts, settings.send_backoff,
                                   settings.network_timeout, send_ssl)
        self.patients = Patients(self.journal, self.store, self.predictor, settings.completion_timeout,
                                 self.sends.schedule if self.sends is not None else None)
        self.patients.resume()
        self._server = self._start_server()
        workers = [(self.patients.work, "predict"), (self.patients.watch, "watch")]
        if self.sends is not None:
            workers.append((self.sends.run, "send"))
        for target, name in workers:
            thread = threading.Thread(target=target, args=(self._stop,), name=f"node-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        logger.info("Listening as %s on %s:%d%s; store %s%s", settings.ae_title, settings.host, self.port,
                    " (TLS)" if settings.tls_cert else "", self.store.root,
                    f"; answers go to {settings.send_to}" if settings.send_to else "")
        return self

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def stop(self, timeout: float = 60.0) -> None:
        """Stop listening, let a running prediction finish (up to ``timeout``), close the journal."""
        self._stop.set()
        if self.patients is not None:
            self.patients.wake()
        if self._server is not None:
            self._server.shutdown()
        if self.sends is not None:
            self.sends.wake()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(deadline - time.monotonic(), 0.1))
        if not any(thread.is_alive() for thread in self._threads):
            if self.journal is not None:
                self.journal.close()
            if self._lock_file is not None:
                self._lock_file.__exit__(None, None, None)

    def __enter__(self) -> "Node":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _name(self, uid: str) -> str:
        return self.patients.name(uid)

    def _start_server(self):
        settings = self.settings
        ae = AE(ae_title=settings.ae_title)
        ae.add_supported_context(Verification)
        for sop_class in SOP_CLASSES:
            ae.add_supported_context(sop_class, ALL_TRANSFER_SYNTAXES)
        ae.require_called_aet = True
        ae.require_calling_aet = list(settings.allow)
        ae.maximum_associations = settings.max_associations
        ae.maximum_pdu_size = MAX_PDU
        ae.acse_timeout = settings.acse_timeout
        ae.dimse_timeout = ae.network_timeout = settings.network_timeout
        handlers = [(evt.EVT_C_ECHO, self._on_echo), (evt.EVT_C_STORE, self._on_store),
                    (evt.EVT_CONN_CLOSE, self._on_close), (evt.EVT_REJECTED, self._on_rejected),
                    (evt.EVT_ACCEPTED, self._on_accepted)]
        context = (server_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
                   if settings.tls_cert is not None else None)
        return start_server(ae, (settings.host, settings.port), handlers, context, settings.acse_timeout,
                            settings.max_pending)

    # Associations

    def _on_echo(self, event) -> int:
        return SUCCESS

    def _on_rejected(self, event) -> None:
        requestor = event.assoc.requestor
        calling = text_of(requestor.ae_title)
        called = text_of(getattr(requestor.primitive, "called_ae_title", ""))
        answer = event.assoc.acceptor.primitive
        rejection = (answer.result, answer.result_source, answer.diagnostic) if answer is not None else ()
        if rejection == LOCAL_LIMIT_EXCEEDED:
            why = f"{self.settings.max_associations} associations open, the most --max-associations allows"
        elif self.settings.allow and calling not in self.settings.allow:
            why = f"calling AE title {printable(calling)!r} is not in --allow"
        elif called != self.settings.ae_title:
            why = f"called AE title {printable(called)!r} is not {self.settings.ae_title!r}"
        else:
            why = "refused by pynetdicom (see --verbose)"
        logger.warning("Refused an association from %s: %s", _peer((requestor.address, requestor.port)), why)

    def _on_accepted(self, event) -> None:
        refused = event.assoc.rejected_contexts
        if refused:
            requestor = event.assoc.requestor
            classes = sorted({printable(UID(text_of(context.abstract_syntax)).name) for context in refused})
            logger.warning("Association from %s at %s: refused its presentation context(s) for %s (this node takes "
                           "CT Image, RT Structure Set, RT Plan, RT Dose and Verification)",
                           printable(requestor.ae_title), _peer((requestor.address, requestor.port)),
                           printable(", ".join(classes), 240))

    def _on_close(self, event) -> None:
        self.patients.closed(id(event.assoc), stopping=self._stop.is_set())

    # Receiving

    def _on_store(self, event):
        settings, request = self.settings, event.request
        calling = printable(event.assoc.requestor.ae_title)
        try:
            size = request.DataSet.getbuffer().nbytes
            check_room(size, self.store.free_bytes(), settings.max_object_bytes, settings.min_free_bytes)
            received = examine(lambda: event.dataset, text_of(request.AffectedSOPClassUID),
                               text_of(request.AffectedSOPInstanceUID), event.context.transfer_syntax)
            path = self.store.write_object(received.series_uid, received.sop_instance_uid, event.encoded_dataset())
            self.patients.received(id(event.assoc), received, path, size, calling)
            return SUCCESS
        except Refusal as refusal:
            status, comment = refusal.status, refusal.comment
        except OSError as error:  # the disk: full, gone, read-only
            status, comment = OUT_OF_RESOURCES, f"cannot write the object: {one_line(error)}"
        except Exception as error:  # noqa: BLE001 - a bad object must not stop the node
            status, comment = PROCESSING_FAILURE, f"cannot store the object: {one_line(error)}"
        self._refused(event, calling, status, comment)
        answer = Dataset()
        answer.Status = status
        answer.ErrorComment = comment[:64]
        return answer

    def _refused(self, event, calling: str, status: int, comment: str) -> None:
        """Journal and log a refused C-STORE with what its data set names."""
        requestor, request = event.assoc.requestor, event.request
        names = named_in(lambda: event.dataset)
        uid = text_of(request.AffectedSOPInstanceUID)
        modality = names.get("modality") or SOP_CLASSES.get(text_of(request.AffectedSOPClassUID), "object")
        patient = printable(names.get("patient_id")) or "(no PatientID)"
        try:
            self.journal.add_refusal(
                sop_instance_uid=uid, sop_class_uid=names.get("sop_class_uid") or text_of(request.AffectedSOPClassUID),
                modality=modality, series_uid=names.get("series_uid", ""), frame_uid=names.get("frame_uid", ""),
                patient_id=names.get("patient_id", ""), calling_ae=calling,
                peer=_peer((requestor.address, requestor.port)), status=status, reason=comment)
        except Exception as error:  # noqa: BLE001 - the journal itself failed (a full disk): say so, answer anyway
            comment = f"{comment} (not journaled: {one_line(error)})"
        logger.warning("Refused %s %s of patient %s from %s, status 0x%04X: %s", modality, printable(uid), patient,
                       calling, status, comment)
