"""The suite's two tiers. ``bash scripts/test --quick`` runs the tests not marked ``slow``: no test
of that tier trains, resumes, predicts with a trained model or starts a Python process that loads TensorFlow
(its import alone takes seconds). What keeps the tier quick:

- at collection (:func:`unmarked_users_of_training_fixtures`), a test not marked ``slow`` that uses
  a fixture that trains or predicts (found in the fixture's code, nested functions included: it
  calls ``trained_once``, ``train``, ``predict_stage``, ``commission`` or a ``CliRunner``) is an error;
- while a test not marked ``slow`` runs, its setup included (:func:`heavy_calls_refused`), training
  epochs (``training.train.run_epochs``), loading a trained model
  (``RunFolder.load_trained_model``) or a Python child process that loads TensorFlow fail it,
  naming what it did and the marker to add. A child is seen to load TensorFlow in its memory map
  (``/proc/<pid>/maps``: TensorFlow's library, mapped a tenth of a second into its import); where
  there is no ``/proc``, a child that outlives ``CHILD_SECONDS`` is taken for one. (A time limit
  alone also failed children that load no TensorFlow on a busy machine: a DICOM import took 4.5 s.)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import types

import pytest

TRAINING_NAMES = frozenset({"trained_once", "train", "predict_stage", "commission", "CliRunner"})
CHILD_SECONDS = 4.0  # without /proc: a Python child that runs longer has imported TensorFlow (its import: ~5 s)
TENSORFLOW_LIBRARY = "libtensorflow"  # in what a process that imported TensorFlow maps (libtensorflow_framework.so.2)
POLL_SECONDS = 0.05
# The slow marker of a test that trains nothing but takes 5 s or more on 2 cores (the quick tier's
# budget: real patients through the cache or a DICOM archive, a calibration's statistics, ...)
SLOW_FOR_ITS_TIME = pytest.mark.slow
MARK = "mark it @pytest.mark.slow (the quick tier, bash scripts/test --quick, leaves such tests out)"


class HeavyTestError(AssertionError):
    """A test outside the slow tier did what only the slow tier may."""


def _names(code: types.CodeType):
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _names(constant)


def trains(function) -> bool:
    """Whether a fixture function's code (its nested functions too) calls something that trains or predicts."""
    code = getattr(function, "__code__", None)
    return code is not None and bool(TRAINING_NAMES & set(_names(code)))


def unmarked_users_of_training_fixtures(items) -> list[str]:
    """One line per test not marked ``slow`` that uses a fixture that trains (see the module)."""
    found = []
    for item in items:
        if item.get_closest_marker("slow") is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        for name in (info.names_closure if info is not None else ()):
            definitions = info.name2fixturedefs.get(name) or ()
            if any(trains(definition.func) for definition in definitions):
                found.append(f"{item.nodeid} uses the fixture {name!r}, which trains or predicts: {MARK}")
                break
    return found


def _loads_tensorflow(pid: int, ended: threading.Event) -> bool | None:
    """Whether the process ``pid`` maps TensorFlow's library before it ends (or ``ended`` is set);
    None where the system has no ``/proc`` to tell."""
    maps = f"/proc/{pid}/maps"
    if not os.path.exists(maps):
        return None
    while not ended.is_set():
        try:
            with open(maps) as handle:
                mapped = handle.read()
        except OSError:  # gone
            return False
        if not mapped:  # ended, not yet reaped
            return False
        if TENSORFLOW_LIBRARY in mapped:
            return True
        ended.wait(POLL_SECONDS)
    return False


class _Child:
    """A Python child process of a test, watched for TensorFlow from its start to its end."""

    def __init__(self, process: subprocess.Popen, what: str):
        self.what, self.started, self.ended = what, time.monotonic(), None
        self.tensorflow: bool | None = None
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, args=(process.pid,), daemon=True)
        self._watcher.start()

    def _watch(self, pid):
        self.tensorflow = _loads_tensorflow(pid, self._stop)

    def end(self):
        if self.ended is None:
            self.ended = time.monotonic()

    def refusal(self, nodeid: str) -> str | None:
        """Why the test may not run this child outside the slow tier, or None."""
        self._stop.set()
        self._watcher.join()
        seconds = (self.ended or time.monotonic()) - self.started
        if self.tensorflow:
            return (f"{nodeid} ran a Python process of its own that loaded TensorFlow ({self.what}, {seconds:.0f} s): "
                    f"{MARK}")
        if self.tensorflow is None and seconds > CHILD_SECONDS:
            return f"{nodeid} ran a Python process of its own ({self.what}) for {seconds:.0f} s: {MARK}"
        return None


# The package's and subprocess's own functions that the guards replace, while a guard has replaced them
# (a guard inside a guarded block, as when a quick test runs a suite of its own with pytester, watches
# with the package's own functions: the innermost guard judges; heavy_calls_allowed puts them back)
_OWN: list[tuple] = []


def _watched():
    from provided_code.run_folder import RunFolder
    from provided_code.training import train as train_module

    return train_module, RunFolder


def _current() -> tuple:
    train_module, RunFolder = _watched()
    return train_module.run_epochs, RunFolder.load_trained_model, subprocess.Popen.__init__, subprocess.Popen.wait


@contextlib.contextmanager
def _installed(functions: tuple):
    train_module, RunFolder = _watched()
    before = _current()
    train_module.run_epochs, RunFolder.load_trained_model, subprocess.Popen.__init__, subprocess.Popen.wait = functions
    try:
        yield
    finally:
        train_module.run_epochs, RunFolder.load_trained_model, subprocess.Popen.__init__, subprocess.Popen.wait = before


@contextlib.contextmanager
def heavy_calls_allowed():
    """While the block runs, the package's own functions, even inside a block of
    :func:`heavy_calls_refused` (a slow test of a suite that a quick test runs with pytester)."""
    if not _OWN:
        yield
        return
    with _installed(_OWN[0]):
        yield


@contextlib.contextmanager
def heavy_calls_refused(nodeid: str):
    """While the block runs, training epochs and loading a trained model raise
    :class:`HeavyTestError`, and again when the block ends (had the test caught it); a Python child
    process that loads TensorFlow (see the module) fails the test when the block ends."""

    refusals = []  # said again when the block ends: a test that expects an error (CliRunner's exit code) may catch it

    def refused(what):
        def call(*args, **kwargs):
            refusals.append(f"{nodeid} {what}: {MARK}")
            raise HeavyTestError(refusals[-1])
        return call

    own = _OWN[0] if _OWN else _current()
    popen_init, popen_wait = own[2:]
    children = {}  # Popen -> _Child

    def watched_init(self, args, *rest, **kwargs):
        popen_init(self, args, *rest, **kwargs)
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        if argv and str(argv[0]) == sys.executable:
            children[self] = _Child(self, " ".join(str(word) for word in argv[1:3]))

    def watched_wait(self, *args, **kwargs):  # subprocess.run and communicate end here
        code = popen_wait(self, *args, **kwargs)
        if self in children:
            children[self].end()
        return code

    _OWN.append(own)
    try:
        with _installed((refused("trains (training epochs ran)"), refused("loads a trained model"),
                         watched_init, watched_wait)):
            yield
    finally:
        _OWN.pop()
        refusals += [refusal for refusal in (child.refusal(nodeid) for child in children.values()) if refusal]
    if refusals:
        raise HeavyTestError("\n".join(dict.fromkeys(refusals)))
