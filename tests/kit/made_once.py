"""Material made once per test run and shared by the pytest-xdist workers (phantoms, their cache,
trained runs): the first worker to ask makes it in the folder the workers share, under a lock file;
the others wait for it and use it too. Read-only once made, and removed when the run ends
(:func:`leave_only`), as the folders of module and session fixtures are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _shared_base(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's folder, shared by its workers (one per run: never stale)
    return base


def _make_locked(lock_path: Path, folder: Path, made: Path, make, wait: bool = True) -> bool:
    """Under the lock file ``lock_path``, ``make(folder)`` unless ``made`` says it was; False when
    ``wait`` is False and another worker holds the lock (it is making it)."""
    import fcntl

    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that died making it
            make(folder)
            made.touch()
    return True


def made_once(tmp_path_factory, name: str, make) -> Path:
    """The folder ``name`` that ``make(folder)`` fills once for the whole test run: under pytest-xdist
    the first worker to ask makes it in the folder the workers share, the others wait for it (a lock
    file) and use it too. For read-only material only (phantoms, a trained model to predict with)."""
    base = _shared_base(tmp_path_factory)
    folder = base / name
    _make_locked(base / f"{name}.lock", folder, base / f"{name}.made", make)
    return folder


def made_once_with_value(tmp_path_factory, name: str, make):
    """:func:`made_once` for material that comes with a value besides its files (paths into it, the
    report of the command that made it, arrays): ``make(folder)`` fills the folder and returns the
    value, picklable; every worker gets that one value back (kept in ``value.pickle`` beside the
    material). A module fixture built this way is built once per test run, not once per worker
    that runs one of the module's tests."""
    import pickle

    def make_and_keep(folder: Path) -> None:
        folder.mkdir(parents=True)
        value = make(folder)
        (folder / "value.pickle").write_bytes(pickle.dumps(value))

    folder = made_once(tmp_path_factory, name, make_and_keep)
    return pickle.loads((folder / "value.pickle").read_bytes())


def made_once_in_parts(tmp_path_factory, name: str, parts: dict[str, object]) -> Path:
    """:func:`made_once` for a folder of independent parts (``{subfolder: make(subfolder)}``): the
    workers that ask at once share the making, each taking the parts no other has begun, then
    waiting for the rest."""
    base = _shared_base(tmp_path_factory)
    folder, marks = base / name, base / f"{name}.parts"
    marks.mkdir(exist_ok=True)
    for wait in (False, True):
        for index, (part, make) in enumerate(parts.items()):
            _make_locked(marks / f"{index}.lock", folder / part, marks / f"{index}.made", make, wait=wait)
    return folder


def leave_only(base: Path, kept, workers: bool) -> None:
    """At the end of a test run (or of one pytest-xdist worker's part of it), everything in ``base``,
    pytest's temporary folder for it, removed but the folders in ``kept`` (those of the tests that
    failed, to look into) and, when ``workers``, pytest-xdist's worker folders (``popen-gw<n>``:
    each worker empties its own). What goes: this module's material, the folders of module and
    session fixtures (``tmp_path_factory.mktemp``), and those of passed tests pytest could not remove.
    pytest itself keeps only failed tests' folders (``tmp_path_retention_policy``), but all of
    ``base`` once a test failed: gigabytes of phantoms, caches and trained runs."""
    kept = {Path(path).resolve() for path in kept}
    if not base.is_dir():
        return
    for entry in base.iterdir():
        if entry.resolve() in kept or (workers and entry.name.startswith("popen-gw")):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
