"""The node's transport: a Storage SCP (with Verification) for CT, RT Structure Set, RT Plan and RT
Dose on pynetdicom, and the :class:`Node` that wires it to the intake checks (``intake``), the
store, the patients' state machine (``patients``) and the send queue (``send_queue``).

- A connection has ``--acse-timeout`` seconds to finish its TLS handshake and start its association
  request; until it does it is no association (it counts against no limit, costs one waiting
  thread), and at most ``--max-pending`` such connections are kept: beyond, the oldest is closed.
  At most ``--max-associations`` associations are served at once, at most ``--max-per-address`` of
  them from one address and ``--max-per-caller`` from one calling AE title at one address; one more
  is rejected (transient, local limit exceeded) and logged with its address. An association silent
  for ``--network-timeout`` seconds is aborted.
- Each C-STORE is checked (``intake``), written whole into the store, journaled, then answered
  with success; anything else is answered with a DICOM failure status, journaled as a refusal and
  logged in one line naming the object's patient.
"""

from __future__ import annotations

import dataclasses
import gc
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
from provided_code.apps.node.journal import (
    ASSOCIATION_REFUSED,
    CLASSES_REFUSED,
    LIMIT_REFUSED,
    TLS_REFUSED,
    Journal,
)
from provided_code.apps.node.patients import Patients
from provided_code.apps.node import reactor
from provided_code.apps.node.reactor import WaitingRequestHandler
from provided_code.apps.node.send_queue import SendQueue
from provided_code.apps.node.sender import MAX_BACKOFF_S, NO_TLS_REASONS, Destination, client_ssl_context
from provided_code.apps.node.store import LOCK_FILE, Store
from provided_code.apps.node.text import RepeatedLines, one_line, printable, text_of
from provided_code.infra.run_lock import RunLock

logger = logging.getLogger(__name__)

MAX_PDU = 256 * 1024
GARBAGE_EVERY_S = 6.0  # the accept loop collects garbage at most this often, and only after associations ended
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
    send_retry_for: float = 86400.0  # s after a patient's first failed send attempt that its sends give up
    send_backoff: float = 5.0  # s before the second attempt; doubling, at most send_backoff_max
    send_backoff_max: float = MAX_BACKOFF_S
    network_timeout: float = 60.0  # s an association may be silent (and a send wait for an answer)
    acse_timeout: float = 10.0  # s a connection has to finish its TLS handshake and request an association
    max_associations: int = 20  # associations served at once
    max_per_caller: int = 5  # of them from one calling AE title at one address (at most max_associations)
    max_per_address: int = 10  # of them from one address, whatever its AE titles (at most max_associations)
    max_pending: int = 100  # connections at once that have not requested an association yet


TAKES = "it takes CT Image, RT Structure Set, RT Plan, RT Dose and Verification"
UNUSED_SAID_MAX = 1000  # callers whose unused proposals the node remembers having said


@dataclasses.dataclass
class _Seen:
    """What the node saw of one association, from its request to its connection's close."""

    address: tuple  # (host, port)
    calling: str
    called: str
    caller: tuple[str, str] | None = None  # (calling AE title, host) while it counts against the limits
    over_limit: str = ""  # the limit it was rejected for: "caller" (--max-per-caller), "address" (--max-per-address)
    refused: tuple[str, ...] = ()  # the storage classes whose presentation contexts were refused
    used: int = 0  # C-STOREs and C-ECHOs it sent


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
    lines: RepeatedLines  # what it logs of connections, each said once per address and window
    refused: Callable[[object, str, str], None] | None  # (address, kind, reason) of a connection refused: the node's

    def refuse(self, address, kind: str, reason: str, message: str, *args) -> None:
        """A connection refused before its association (TLS, the pending limit): to the node's
        ``refused`` (which logs and journals it), or logged (``message % args``, a warning)."""
        if self.refused is not None:
            self.refused(address, kind, reason)
        else:
            self.lines.say(("refused", _host(address), kind, reason), logging.WARNING, message % args, message, *args)

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
        self._running: set[int] = set()  # the association threads (idents) seen running at the last turn
        self._ended = False  # one has ended since garbage was last collected
        self._collected_at = time.monotonic()

    def service_actions(self):
        """Once per turn of the accept loop: pynetdicom collects garbage every 60th turn (the reference
        cycles its ended associations leave), 6 s here; this, as often at most, and only after an
        association's thread ended (idle, never: a full collection of a process holding TensorFlow costs)."""
        running = {assoc.ident for assoc in self.active_associations}
        self._ended = self._ended or not self._running <= running
        self._running = running
        if self._ended and time.monotonic() - self._collected_at >= GARBAGE_EVERY_S:
            self._ended, self._collected_at = False, time.monotonic()
            gc.collect()

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
            self.refuse(_address_of(evicted), LIMIT_REFUSED, f"closed before its association request: "
                        f"{self.max_pending} connections waiting, the most --max-pending allows",
                        "Closed a connection from %s that had not requested an association: %d connections waiting, "
                        "the most --max-pending allows", _peer(_address_of(evicted)), self.max_pending)
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
                        reason = tls_failure(error, self.acse_timeout)
                        self.refuse(address, TLS_REFUSED, reason, "TLS handshake with %s failed: %s", _peer(address),
                                    reason)
                    return False
                if request.pending():
                    return self._still_waiting(request)
            poller = select.poll()  # not select.select: its descriptors stop at 1024
            poller.register(request, select.POLLIN)
            readable = poller.poll(max(deadline - time.monotonic(), 0) * 1000)
            if not self._still_waiting(request):
                return False  # closed to make room (logged by whom closed it)
            if not readable:
                self.lines.say(("silent", _host(address)), logging.INFO,
                               f"Closed a connection from {_host(address)}: no association request within "
                               f"{self.acse_timeout:g} s (--acse-timeout)",
                               "Closed a connection from %s: no association request within %g s (--acse-timeout)",
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
        self.lines.flush()


def _host(address) -> str:
    """A client's address without its port (what its repeated connections share)."""
    return str(address[0]) if isinstance(address, tuple) and address else str(address)


# OpenSSL's reasons for a failed handshake, in words for IT (the reason itself follows in brackets)
TLS_WORDS = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client presented no certificate (--tls-ca requires one)",
    "CERTIFICATE_VERIFY_FAILED": "the client's certificate is not signed by --tls-ca",
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust this node's certificate",
    "BAD_CERTIFICATE": "the client's certificate is not signed by --tls-ca",
    "UNSUPPORTED_PROTOCOL": "the client offered only TLS older than 1.2",
    "TLSV1_ALERT_PROTOCOL_VERSION": "the client offered only TLS older than 1.2",
    "WRONG_SSL_VERSION": "the client offered only TLS older than 1.2",
    "NO_SHARED_CIPHER": "the client shares no cipher with this node",
}


def tls_failure(error: BaseException, timeout: float) -> str:
    """Why a client's TLS handshake failed, in words, with OpenSSL's reason."""
    reason = getattr(error, "reason", None) or ""
    if reason in TLS_WORDS:
        return f"{TLS_WORDS[reason]} ({reason})"
    if isinstance(error, (TimeoutError, socket.timeout)):
        return f"no TLS handshake within {timeout:g} s (--acse-timeout)"
    if isinstance(error, ssl.SSLEOFError) or not reason:
        return f"the client closed the connection during the handshake ({one_line(error)})"
    if reason in NO_TLS_REASONS:
        return f"the client spoke no TLS (plain DICOM on the TLS port?) ({reason})"
    return f"handshake failed ({one_line(error)})"


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
                 acse_timeout: float = 30.0, max_pending: int = 100, lines: RepeatedLines | None = None,
                 refused: Callable[[object, str, str], None] | None = None):
    """Serve ``ae`` on ``address`` in a thread of its own (see :class:`_Server`), each association's
    threads waiting rather than polling (``reactor``); ``shutdown()`` stops it within a tenth of a second."""
    reactor.check(ae)  # a pynetdicom the waiting hooks do not fit: fail here, not poll unnoticed
    server = ae.make_server(address, ssl_context=ssl_context, evt_handlers=handlers, server_class=_Server,
                            request_handler=WaitingRequestHandler)
    server.acse_timeout, server.max_pending = acse_timeout, max_pending
    server.lines, server.refused = lines or RepeatedLines(logger), refused
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
        self._lines = RepeatedLines(logger)
        self._associations: dict[int, _Seen] = {}  # id(association) -> what the node saw of it, until it closes
        self._callers: dict[tuple[str, str], int] = {}  # (calling AE title, address) -> its associations counted
        self._addresses: dict[str, int] = {}  # address -> its associations counted, whatever their AE titles
        self._seen_lock = threading.Lock()
        self._unused_said: set[tuple[str, str, tuple[str, ...]]] = set()  # proposals not taken, said once each

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
        self._lock_file = RunLock(self.store.root / LOCK_FILE, "a DICOM node",
                                  advice="stop it, or give this node another --store")
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
                                   self._name, settings.send_retry_for, settings.send_backoff,
                                   settings.network_timeout, send_ssl, settings.send_backoff_max)
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
                    (evt.EVT_REQUESTED, self._on_requested), (evt.EVT_ACCEPTED, self._on_accepted)]
        context = (server_ssl_context(settings.tls_cert, settings.tls_key, settings.tls_ca)
                   if settings.tls_cert is not None else None)
        return start_server(ae, (settings.host, settings.port), handlers, context, settings.acse_timeout,
                            settings.max_pending, self._lines, self._connection_refused)

    def _connection_refused(self, address, kind: str, reason: str, calling: str = "", called: str = "") -> None:
        """A connection or association refused before any object: logged once per address and reason
        within a minute (its repeats summed up), then journaled."""
        lines = []
        for who in (_peer(address), _host(address)):  # the line, and its repeats' summary
            if kind == TLS_REFUSED:
                lines.append(f"TLS handshake with {who} failed: {reason}")
            elif calling:
                lines.append(f"Refused an association from {who} ({printable(calling)}): {reason}")
            else:
                lines.append(f"Refused a connection from {who}: {reason}")
        self._lines.say(("refused", _host(address), printable(calling), kind, reason), logging.WARNING, lines[1],
                        lines[0])
        try:
            self.journal.add_connection_refusal(peer=_host(address), kind=kind, reason=reason, calling_ae=calling,
                                                called_ae=called)
        except Exception as error:  # noqa: BLE001 - the journal itself failed (a full disk): say so
            logger.error("The refusal of %s was not journaled: %s", _peer(address), one_line(error))

    # Associations

    def _on_requested(self, event) -> None:
        """An association requested: what the node sees of it is kept until its connection closes;
        beyond ``--max-per-caller`` associations from its calling AE title at its address, or
        ``--max-per-address`` from its address under any AE titles (while the node has room for more:
        else pynetdicom refuses it for the total), it is rejected, transient."""
        assoc, settings = event.assoc, self.settings
        requestor = assoc.requestor
        calling = text_of(getattr(requestor.primitive, "calling_ae_title", ""))  # requestor.ae_title: not yet
        seen = _Seen((requestor.address, requestor.port), calling,
                     text_of(getattr(requestor.primitive, "called_ae_title", "")))
        caller = (calling, requestor.address)
        with self._seen_lock:
            self._associations[id(assoc)] = seen
            if sum(self._callers.values()) >= settings.max_associations:
                over = ""  # pynetdicom refuses it for the total
            elif self._addresses.get(requestor.address, 0) >= min(settings.max_per_address, settings.max_associations):
                over = "address"
            elif self._callers.get(caller, 0) >= min(settings.max_per_caller, settings.max_associations):
                over = "caller"
            else:
                over = ""
            if not over:
                self._callers[caller] = self._callers.get(caller, 0) + 1
                self._addresses[requestor.address] = self._addresses.get(requestor.address, 0) + 1
                seen.caller = caller
                return
        seen.over_limit = over
        assoc.acse.send_reject(*LOCAL_LIMIT_EXCEEDED)
        evt.trigger(assoc, evt.EVT_REJECTED, {})
        assoc.kill()

    def _on_echo(self, event) -> int:
        self._used(event.assoc)
        return SUCCESS

    def _used(self, assoc) -> None:
        seen = self._associations.get(id(assoc))
        if seen is not None:
            seen.used += 1

    def _on_rejected(self, event) -> None:
        assoc, settings = event.assoc, self.settings
        requestor = assoc.requestor
        seen = self._associations.get(id(assoc))
        calling = text_of(getattr(requestor.primitive, "calling_ae_title", ""))
        called = text_of(getattr(requestor.primitive, "called_ae_title", ""))
        answer = assoc.acceptor.primitive
        rejection = (answer.result, answer.result_source, answer.diagnostic) if answer is not None else ()
        kind = LIMIT_REFUSED
        if seen is not None and seen.over_limit == "caller":
            why = (f"{printable(calling)!r} at {requestor.address} holds {settings.max_per_caller} associations, the "
                   f"most --max-per-caller allows")
        elif seen is not None and seen.over_limit == "address":
            why = (f"{requestor.address} holds {settings.max_per_address} associations, the most --max-per-address "
                   f"allows (whatever their calling AE titles)")
        elif rejection == LOCAL_LIMIT_EXCEEDED:
            why = f"{settings.max_associations} associations open, the most --max-associations allows"
        elif settings.allow and calling not in settings.allow:
            why, kind = f"calling AE title {printable(calling)!r} is not in --allow", ASSOCIATION_REFUSED
        elif called != settings.ae_title:
            why, kind = f"called AE title {printable(called)!r} is not {settings.ae_title!r}", ASSOCIATION_REFUSED
        else:
            why, kind = "refused by pynetdicom (see --verbose)", ASSOCIATION_REFUSED
        self._connection_refused((requestor.address, requestor.port), kind, why, calling, called)

    def _on_accepted(self, event) -> None:
        seen = self._associations.get(id(event.assoc))
        if seen is not None:
            seen.refused = tuple(sorted({printable(UID(text_of(context.abstract_syntax)).name)
                                         for context in event.assoc.rejected_contexts}))

    def _on_close(self, event) -> None:
        with self._seen_lock:
            seen = self._associations.pop(id(event.assoc), None)
            if seen is not None and seen.caller is not None:
                for counts, key in ((self._callers, seen.caller), (self._addresses, seen.caller[1])):
                    left = counts.get(key, 0) - 1
                    if left > 0:
                        counts[key] = left
                    else:
                        counts.pop(key, None)
        self.patients.closed(id(event.assoc), stopping=self._stop.is_set())
        if seen is not None and seen.refused and not seen.over_limit:
            self._refused_classes(seen)

    def _refused_classes(self, seen: "_Seen") -> None:
        """An association closed whose presentation contexts were refused for some storage classes.
        If it sent nothing (it proposed only what the node does not take: it meant those), a refusal,
        warned and journaled; else the classes were proposals it did not use (DCMTK's storescu
        proposes some 120): said once per caller and set of classes, at info."""
        shown = ", ".join(seen.refused[:3]) + (f" and {len(seen.refused) - 3} more" if len(seen.refused) > 3 else "")
        if not seen.used:
            self._connection_refused(seen.address, CLASSES_REFUSED, f"nothing sent: this node refused its "
                                                                    f"presentation context(s) for {shown} ({TAKES})",
                                     seen.calling, seen.called)
            return
        key = (seen.calling, _host(seen.address), seen.refused)
        with self._seen_lock:
            said = key in self._unused_said
            if len(self._unused_said) >= UNUSED_SAID_MAX:  # callers by the thousand (made-up AE titles): start over
                self._unused_said.clear()
            self._unused_said.add(key)
        (logger.debug if said else logger.info)(
            "Association from %s at %s also proposed %d storage class(es) this node does not take, unused (%s; "
            "not said again for this caller)", printable(seen.calling), _peer(seen.address), len(seen.refused), shown)

    # Receiving

    def _on_store(self, event):
        self._used(event.assoc)
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
