"""The suite's two tiers. ``bash scripts/test --quick`` runs the tests not marked ``slow``: no test
of that tier trains, resumes, predicts with a trained model or starts a Python process that runs
for long (TensorFlow's import alone takes seconds). What keeps the tier quick:

- at collection (:func:`unmarked_users_of_training_fixtures`), a test not marked ``slow`` that uses
  a fixture that trains or predicts (found in the fixture's code, nested functions included: it
  calls ``trained_once``, ``train``, ``predict_stage``, ``commission`` or a ``CliRunner``) is an error;
- while a test not marked ``slow`` runs, its setup included (:func:`heavy_calls_refused`), training
  epochs (``training.train.run_epochs``), loading a trained model
  (``RunFolder.load_trained_model``) or a Python child process that outlives
  ``CHILD_SECONDS`` fail it, naming what it did and the marker to add.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import types

TRAINING_NAMES = frozenset({"trained_once", "train", "predict_stage", "commission", "CliRunner"})
CHILD_SECONDS = 4.0  # a Python child that runs longer has imported TensorFlow (its import alone: ~5 s here)
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


@contextlib.contextmanager
def heavy_calls_refused(nodeid: str):
    """While the block runs, training epochs, loading a trained model and long Python child
    processes raise :class:`HeavyTestError` (or, for a child, fail the test when it ends)."""
    from provided_code.run_folder import RunFolder
    from provided_code.training import train as train_module

    def refused(what):
        def call(*args, **kwargs):
            raise HeavyTestError(f"{nodeid} {what}: {MARK}")
        return call

    children = {}  # Popen -> [what, started, ended or None]
    popen_init, popen_wait = subprocess.Popen.__init__, subprocess.Popen.wait

    def watched_init(self, args, *rest, **kwargs):
        popen_init(self, args, *rest, **kwargs)
        argv = [args] if isinstance(args, (str, bytes)) else list(args)
        if argv and str(argv[0]) == sys.executable:
            children[self] = [" ".join(str(word) for word in argv[1:3]), time.monotonic(), None]

    def watched_wait(self, *args, **kwargs):  # subprocess.run and communicate end here
        code = popen_wait(self, *args, **kwargs)
        if self in children and children[self][2] is None:
            children[self][2] = time.monotonic()
        return code

    saved = (train_module.run_epochs, RunFolder.load_trained_model)
    train_module.run_epochs = refused("trains (training epochs ran)")
    RunFolder.load_trained_model = refused("loads a trained model")
    subprocess.Popen.__init__, subprocess.Popen.wait = watched_init, watched_wait
    try:
        yield
    finally:
        train_module.run_epochs, RunFolder.load_trained_model = saved
        subprocess.Popen.__init__, subprocess.Popen.wait = popen_init, popen_wait
    now = time.monotonic()
    for what, started, ended in children.values():
        if (ended or now) - started > CHILD_SECONDS:
            raise HeavyTestError(f"{nodeid} ran a Python process of its own ({what}) for "
                                 f"{(ended or now) - started:.0f} s: {MARK}")
