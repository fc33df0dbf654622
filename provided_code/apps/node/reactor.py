"""pynetdicom's association threads made to wait rather than poll, for the associations the node
accepts (and the test kit's listener, which serves through ``server.start_server`` too).

pynetdicom 3.0 runs two threads per association and both poll: the DUL thread (its state machine
and socket) looks at the socket with a select of timeout 0 and sleeps 1 ms between looks, and the
association thread (its DIMSE and ACSE) sleeps 1 ms between looks at its queues: some 2,000 wake-ups
a second for each idle association (10 of them held half a core). Here:

- the DUL thread (:class:`WaitingDUL`) waits in ``poll()`` on its socket and on a socket pair that
  wakes it whenever something is queued for it (a primitive to send, an event, its end asked);
- the association thread (:class:`WaitingAssociation`) waits on an event that is set whenever
  something is queued for it (a DIMSE message, a primitive from the peer), after each action of the
  DUL's state machine, when the DUL thread ends and when the association is killed.

Each also wakes at its timers (the ARTIM timer, the network timeout) and at the latest every
:data:`LONGEST_WAIT_S`, so that nothing is missed that no wake-up covers. An association that ends
tells its server (``association_ended``), which collects the garbage it leaves then (pynetdicom's
server collects every 60th turn of its accept loop, 6 s here, whether anything ended or not: a full
collection of a process holding TensorFlow, a tenth of a core). The loops are pynetdicom
3.0's (``DULServiceProvider.run_reactor``, ``Association._run_reactor``, and the request handler's
``_create_association``) with only their waits changed.
"""

from __future__ import annotations

import logging
import queue
import select
import socket
import ssl
import threading
from copy import deepcopy
from datetime import datetime

from pynetdicom import evt
from pynetdicom._globals import MODE_ACCEPTOR
from pynetdicom.association import Association
from pynetdicom.dul import DULServiceProvider
from pynetdicom.pdu import A_ABORT_RQ
from pynetdicom.transport import AssociationSocket, RequestHandler

# what pynetdicom's own loops log, under their names
_DUL_LOG, _ASSOCIATION_LOG = logging.getLogger("pynetdicom.dul"), logging.getLogger("pynetdicom.association")

LONGEST_WAIT_S = 1.0


class _SignallingQueue(queue.Queue):
    """A queue that calls ``signal()`` after each item put in it."""

    def __init__(self, signal):
        super().__init__()
        self._signal = signal

    def _put(self, item) -> None:
        super()._put(item)
        self._signal()


class WaitingDUL(DULServiceProvider):
    """pynetdicom's DUL service provider, its thread waiting on its socket (module docstring)."""

    def __init__(self, assoc: "WaitingAssociation"):
        self._kill = False
        self._woken = False
        self._wake_out, self._wake_in = socket.socketpair()
        for end in (self._wake_out, self._wake_in):
            end.setblocking(False)
        super().__init__(assoc)
        self.to_provider_queue = _SignallingQueue(self.wake)
        self.event_queue = _SignallingQueue(self.wake)
        self.to_user_queue = _SignallingQueue(assoc.wake)

    @property
    def _kill_thread(self) -> bool:  # pynetdicom sets it from other threads (stop_dul, kill_dul): wake to see it
        return self._kill

    @_kill_thread.setter
    def _kill_thread(self, value: bool) -> None:
        self._kill = value
        if value:
            self.wake()

    def wake(self) -> None:
        """Wake the DUL thread (from any thread)."""
        if self._woken:
            return
        self._woken = True
        try:
            self._wake_out.send(b"\0")
        except OSError:  # full (it is awake anyway) or closed (it ended)
            pass

    def _wait(self) -> None:
        """Until the socket has data, something is queued, or the ARTIM timer or LONGEST_WAIT_S runs out."""
        transport = self.socket
        sock = transport.socket if transport is not None and transport._is_connected else None
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return
        poller = select.poll()  # not select.select: its descriptors stop at 1024
        poller.register(self._wake_in, select.POLLIN)
        if sock is not None and sock.fileno() >= 0:
            poller.register(sock, select.POLLIN)
        poller.poll(self._artim_left() * 1000)
        try:
            while self._wake_in.recv(256):
                pass
        except OSError:  # emptied
            pass
        self._woken = False

    def _artim_left(self) -> float:
        timer = self.artim_timer
        running = timer.timeout is not None and timer._start_time is not None and timer._end_time is None
        return min(max(timer.remaining, 0.0), LONGEST_WAIT_S) if running else LONGEST_WAIT_S

    def run_reactor(self) -> None:
        try:
            self._react()
        finally:
            self._wake_out.close()
            self._wake_in.close()
            self.assoc.wake()  # it looks at whether this thread is alive

    def _react(self) -> None:
        """pynetdicom 3.0's ``DULServiceProvider.run_reactor``, waiting where it slept 1 ms."""
        self._idle_timer.start()
        idle = False
        while True:
            if not self.assoc._dul_ready.is_set():
                self.assoc._dul_ready.set()
            if idle:
                self._wait()
            if self._kill_thread:
                break
            if self.artim_timer.expired:
                self.event_queue.put("Evt18")
            try:
                if self._process_recv_primitive():
                    pass
                elif self._is_transport_event():
                    self._idle_timer.restart()
            except Exception as exc:  # noqa: BLE001 - as pynetdicom: abort the association, end the thread
                _DUL_LOG.error("Exception in DUL.run(), aborting association")
                _DUL_LOG.exception(exc)
                abort_pdu = A_ABORT_RQ()
                abort_pdu.source = 0x02
                abort_pdu.reason_diagnostic = 0x00
                self.socket.send(abort_pdu.encode())
                self.assoc.is_aborted = True
                self.assoc.is_established = False
                self.assoc._kill = True
                self._kill_thread = True
                return
            try:
                event = self.event_queue.get(block=False)
            except queue.Empty:
                idle = True
                continue
            self.state_machine.do_action(event)
            self.assoc.wake()
            idle = False


class WaitingAssociation(Association):
    """pynetdicom's association, its thread and its DUL's waiting rather than polling (module docstring)."""

    def __init__(self, ae, mode: str):
        self._activity = threading.Event()
        super().__init__(ae, mode)
        self.dul = WaitingDUL(self)
        self.dimse.msg_queue = _SignallingQueue(self.wake)

    def wake(self) -> None:
        """Wake the association thread (from any thread)."""
        self._activity.set()

    def run_reactor(self) -> None:
        try:
            super().run_reactor()
        finally:
            ended = getattr(self._server, "association_ended", None)
            if ended is not None:
                ended()

    def kill(self) -> None:
        self._kill = True
        self.wake()
        super().kill()

    def _wait(self) -> None:
        if self.dimse.msg_queue.qsize():  # a message came while it served the last (each turn serves one)
            return
        timer = self.dul._idle_timer
        left = timer.remaining if timer.timeout is not None else LONGEST_WAIT_S
        self._activity.wait(min(max(left, 0.001), LONGEST_WAIT_S))
        self._activity.clear()

    def _run_reactor(self) -> None:
        """pynetdicom 3.0's ``Association._run_reactor``, waiting where it slept 1 ms."""
        self._is_paused = False
        while not self._kill:
            self._wait()
            self._is_paused = True
            self._reactor_checkpoint.wait()
            self._is_paused = False
            context_id, msg = self.dimse.get_msg(block=False)
            if msg:
                self._serve_request(msg, context_id)
            if self.is_established and self.acse.is_release_requested():
                self.acse.send_release(is_response=True)
                _ASSOCIATION_LOG.info("Association Released")
                self.is_released = True
                self.is_established = False
                evt.trigger(self, evt.EVT_RELEASED, {})
                self.kill()
                return
            if self.acse.is_aborted():
                message = "Association Aborted"
                if self.acse.is_aborted("a-p-abort"):
                    message += " (A-P-ABORT)"
                _ASSOCIATION_LOG.info(message)
                self.dul.receive_pdu(wait=False)
                self.is_aborted = True
                self.is_established = False
                evt.trigger(self, evt.EVT_ABORTED, {})
                self.kill()
                return
            if not self.dul.is_alive():
                self.kill()
                return
            if self.dul.idle_timer_expired():
                _ASSOCIATION_LOG.error("Network timeout reached")
                if self.network_timeout_response == "A-RELEASE":
                    self._is_paused = True
                    self._reactor_checkpoint.wait()
                    self.release()
                    self._is_paused = False
                else:
                    self.abort()
                self.kill()
                return


class WaitingRequestHandler(RequestHandler):
    """pynetdicom's request handler, its associations :class:`WaitingAssociation`."""

    def _create_association(self) -> WaitingAssociation:
        """pynetdicom 3.0's ``RequestHandler._create_association`` with :class:`WaitingAssociation`."""
        assoc = WaitingAssociation(self.ae, MODE_ACCEPTOR)
        assoc._server = self.server
        assoc.name = f"AcceptorThread@{datetime.now():%Y%m%d%H%M%S}"
        assoc.set_socket(AssociationSocket(assoc, client_socket=self.request))
        assoc.acceptor.maximum_length = self.ae.maximum_pdu_size
        assoc.acceptor.ae_title = self.server.ae_title
        assoc.acceptor.address_info = self.local
        assoc.acceptor.implementation_class_uid = self.ae.implementation_class_uid
        assoc.acceptor.implementation_version_name = self.ae.implementation_version_name
        assoc.acceptor.supported_contexts = deepcopy(self.server.contexts)
        assoc.requestor.address_info = self.remote
        for event in self.server._handlers:
            if event.is_intervention and self.server._handlers[event]:
                assoc.bind(event, *self.server._handlers[event])
            elif isinstance(event, evt.NotificationEvent):
                for handler in self.server._handlers[event]:
                    assoc.bind(event, handler[0], handler[1])
        return assoc
