"""pynetdicom's association threads made to wait rather than poll, for the associations the node
accepts (and the test kit's listener, which serves through ``server.start_server`` too).

pynetdicom 3.0 runs two threads per association and both poll: the DUL thread (its state machine
and socket) looks at the socket with a select of timeout 0 and sleeps 1 ms between looks, and the
association thread (its DIMSE and ACSE) sleeps 1 ms between looks at its queues: some 2,000 wake-ups
a second for each idle association (10 of them held half a core).

pynetdicom's own loops keep running; only where they wait is changed, through these hooks (checked
against pynetdicom 3.0.4, :data:`CHECKED_AGAINST`):

- the DUL thread (:class:`WaitingDUL`): its loop sleeps ``_run_loop_delay`` between idle turns (0
  here) and calls ``_is_transport_event()`` each turn that has no primitive to send. That call first
  waits, when nothing is queued for the DUL, in ``poll()`` on the socket and on a socket pair that
  wakes it when something is put on its ``event_queue`` or ``to_provider_queue`` or its
  ``_kill_thread`` is set, at most until the ARTIM timer runs out or :data:`LONGEST_WAIT_S`;
- the association thread: its loop calls ``_reactor_checkpoint.wait()`` every turn (after a 1 ms
  sleep). Its checkpoint (:class:`WaitingCheckpoint`) first waits for activity, unless a DIMSE
  message is already queued: a DIMSE message queued, a primitive from the DUL (``to_user_queue``),
  a change of the DUL's state (seen at the DUL's next turn), the DUL's thread ending, the checkpoint
  set (as by ``kill``, ``abort``, a paused service resuming); at most until the network (idle) timer runs out or
  :data:`LONGEST_WAIT_S`. Then it is the ``threading.Event`` it replaces: cleared, it still pauses
  the loop as pynetdicom pauses it;
- the request handler (:class:`WaitingRequestHandler`): pynetdicom's ``_create_association``
  makes a plain ``Association`` (its class imported in its body, so not to be chosen without
  copying that body); it runs as it is, and :func:`install` then fits the association it returns,
  not started yet, with the checkpoint, a signalling DIMSE queue, and its DUL made a
  :class:`WaitingDUL` in place (its class changed, all it holds kept: the connection's first
  event, queued already, its socket and timers).

Nothing of pynetdicom's bodies is reproduced here. :func:`check` (at ``server.start_server``) and
:func:`install` raise if an attribute a hook relies on is gone or changed its type (a pynetdicom
that renamed ``_is_transport_event``, ``_reactor_checkpoint``, ...), so a changed pynetdicom fails
at the start rather than polling unnoticed; a hook that still exists but is no longer called, the
tests see (tests/test_node.py: each hook entered a few times a second by an idle association, and
10 idle associations under 5 % of a core).

pynetdicom's ``stop_dul`` sleeps ``_run_loop_delay`` (0 here) while the DUL thread ends: a short
spin, as the kill flag wakes that thread at once. An association that ends leaves reference cycles
that the server collects (``server._Server.service_actions``, at most every 6 s).
"""

from __future__ import annotations

import queue
import select
import socket
import ssl
import threading

import pynetdicom
from pynetdicom._globals import MODE_ACCEPTOR
from pynetdicom.association import Association
from pynetdicom.dul import DULServiceProvider
from pynetdicom.transport import RequestHandler

CHECKED_AGAINST = "3.0.4"  # the pynetdicom whose loops these hooks were read against
LONGEST_WAIT_S = 1.0
_MISSING = object()


class _SignallingQueue(queue.Queue):
    """A queue that calls ``signal()`` after each item put in it."""

    def __init__(self, signal):
        super().__init__()
        self._signal = signal

    def _put(self, item) -> None:
        super()._put(item)
        self._signal()


def _signalling(old: queue.Queue, signal) -> "_SignallingQueue":
    """A :class:`_SignallingQueue` holding what ``old`` holds (taken over before any thread uses either)."""
    new = _SignallingQueue(signal)
    new.queue.extend(old.queue)
    return new


class WaitingDUL(DULServiceProvider):
    """pynetdicom's DUL service provider, waiting in ``_is_transport_event`` (module docstring).

    Not made but adopted (:meth:`adopt`): the DUL pynetdicom made for the association becomes one,
    keeping all it holds (the connection's first event queued already, its socket, its timers)."""

    @classmethod
    def adopt(cls, dul: DULServiceProvider) -> "WaitingDUL":
        dul.__class__ = cls
        dul._kill = dul.__dict__.pop("_kill_thread")  # now the property's
        dul._woken = False
        dul._wake_out, dul._wake_in = socket.socketpair()
        for end in (dul._wake_out, dul._wake_in):
            end.setblocking(False)
        dul._state_seen = dul.state_machine.current_state
        dul._run_loop_delay = 0  # its loop's sleep between idle turns: the wait below instead
        dul.to_provider_queue = _signalling(dul.to_provider_queue, dul.wake)
        dul.event_queue = _signalling(dul.event_queue, dul.wake)
        dul.to_user_queue = _signalling(dul.to_user_queue, lambda: dul.assoc._reactor_checkpoint.wake())
        return dul

    @property
    def _kill_thread(self) -> bool:  # set from other threads (stop_dul, kill_dul): wake to see it
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

    def _is_transport_event(self) -> bool:
        self.await_activity()
        return super()._is_transport_event()

    def await_activity(self) -> None:
        """Until the socket has data, something is queued for the DUL, it is to end, or the ARTIM
        timer or LONGEST_WAIT_S runs out; at once if any is so already."""
        try:
            while self._wake_in.recv(256):
                pass
        except OSError:  # emptied
            pass
        self._woken = False  # from here, a put or a kill sends a byte
        if self.state_machine.current_state != self._state_seen:  # an action of its state machine
            self._state_seen = self.state_machine.current_state
            self.assoc._reactor_checkpoint.wake()
        if self._kill or self.event_queue.qsize() or self.to_provider_queue.qsize():
            return
        if self.state_machine.current_state == "Sta13":  # pynetdicom closes the connection at once
            return
        transport = self.socket
        sock = transport.socket if transport is not None and transport._is_connected else None
        if isinstance(sock, ssl.SSLSocket) and sock.pending():  # decrypted already: poll() would not see it
            return
        poller = select.poll()  # not select.select: its descriptors stop at 1024
        poller.register(self._wake_in, select.POLLIN)
        if sock is not None and sock.fileno() >= 0:
            poller.register(sock, select.POLLIN)
        poller.poll(self._artim_left() * 1000)

    def _artim_left(self) -> float:
        timer = self.artim_timer
        running = timer.timeout is not None and timer._start_time is not None and timer._end_time is None
        return min(max(timer.remaining, 0.0), LONGEST_WAIT_S) if running else LONGEST_WAIT_S

    def run(self) -> None:  # the thread's (its target, pynetdicom's run_reactor, was bound before adopt())
        try:
            super().run()
        finally:
            self._wake_out.close()
            self._wake_in.close()
            self.assoc._reactor_checkpoint.wake()  # it looks at whether this thread is alive


class WaitingCheckpoint(threading.Event):
    """An association's ``_reactor_checkpoint`` whose ``wait()``, in the association's own thread,
    first waits for activity (module docstring); set, it lets the association run, cleared, it
    pauses it, as pynetdicom's event."""

    def __init__(self, assoc: Association):
        super().__init__()
        self._assoc = assoc
        self._activity = threading.Event()

    def wake(self) -> None:
        """Wake the association thread (from any thread)."""
        self._activity.set()

    def set(self) -> None:
        super().set()
        self.wake()

    def wait(self, timeout: float | None = None) -> bool:
        if threading.current_thread() is self._assoc:
            self.await_activity()
        return super().wait(timeout)

    def await_activity(self) -> None:
        assoc = self._assoc
        if assoc._kill or not assoc.dul.is_alive() or assoc.dimse.msg_queue.qsize():  # its loop serves one a turn
            return
        timer = assoc.dul._idle_timer
        left = min(timer.remaining, LONGEST_WAIT_S) if timer.timeout is not None else LONGEST_WAIT_S
        if left > 0:
            self._activity.wait(left)
        self._activity.clear()  # what comes from here on, the next wait sees


def _check(assoc: Association) -> None:
    """Raise if what the hooks rely on is not where pynetdicom 3.0.4 had it."""
    dul, missing = assoc.dul, []
    for owner, name, kind in ((DULServiceProvider, "_is_transport_event", None), (dul, "_run_loop_delay", (int, float)), (dul.__dict__, "_kill_thread", bool),
                              (dul, "state_machine", None), (dul, "event_queue", queue.Queue),
                              (dul, "to_provider_queue", queue.Queue), (dul, "to_user_queue", queue.Queue),
                              (dul, "artim_timer", None), (dul, "_idle_timer", None), (dul, "socket", None),
                              (assoc, "_reactor_checkpoint", threading.Event), (assoc, "_kill", bool),
                              (assoc.dimse, "msg_queue", queue.Queue)):
        value = owner.get(name, _MISSING) if isinstance(owner, dict) else getattr(owner, name, _MISSING)
        if value is _MISSING or (kind is not None and not isinstance(value, kind)):
            missing.append(name)
    if type(dul) is not DULServiceProvider:  # adopt() changes its class to a subclass of this one
        missing.append(f"DULServiceProvider (a {type(dul).__name__})")
    if missing or dul.is_alive() or assoc.is_alive():
        raise RuntimeError(f"pynetdicom {pynetdicom.__version__}'s association is not what the node's waiting hooks "
                           f"were written for (pynetdicom {CHECKED_AGAINST}): {', '.join(missing) or 'already started'}")


def check(ae) -> None:
    """Raise now (the server not started) if pynetdicom's association is not what the hooks rely on:
    what :func:`install` checks, on an association made as pynetdicom's request handler makes one."""
    _check(Association(ae, MODE_ACCEPTOR))


def install(assoc: Association) -> Association:
    """Make ``assoc`` (not started yet, its socket set) wait rather than poll (module docstring)."""
    _check(assoc)
    checkpoint = WaitingCheckpoint(assoc)
    if assoc._reactor_checkpoint.is_set():
        checkpoint.set()
    assoc._reactor_checkpoint = checkpoint
    assoc.dimse.msg_queue = _signalling(assoc.dimse.msg_queue, checkpoint.wake)
    WaitingDUL.adopt(assoc.dul)
    return assoc


class WaitingRequestHandler(RequestHandler):
    """pynetdicom's request handler, its associations waiting rather than polling (:func:`install`)."""

    def _create_association(self) -> Association:
        return install(super()._create_association())
