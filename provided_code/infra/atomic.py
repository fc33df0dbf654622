"""Nothing half-written: every output is written beside its final name, then moved into place."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import glob
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Iterator

from provided_code.errors import UserError

try:
    import fcntl
except ImportError:  # not POSIX: no lock tells a live writer's temporary file from a dead one's
    fcntl = None


@contextlib.contextmanager
def atomic_path(path: os.PathLike | str, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; on success fsync it and move it to ``path``.

    On failure the temporary file is removed; a process killed meanwhile leaves only a hidden
    ``.<name>.<pid>.<random><suffix>`` file, never something at ``path``. ``suffix`` lets writers
    that insist on an extension (``.keras``, ``.png``) have it. An ``OSError`` that names no file
    (or only the temporary one), as a full disk's does when raised deep inside a writer (Keras,
    h5py, zipfile), is raised again naming ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")  # see _TEMPORARY_FILE
    try:
        with naming_path(path, also=tmp):
            yield tmp
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


# atomic_path's temporary name, ``.<final name>.<pid>.<8 hex digits><suffix>``, as a pattern
_TEMPORARY_FILE = re.compile(r"^\..+\.\d+\.[0-9a-f]{8}[^/]*$")


def remove_temporaries(folder: os.PathLike | str, final_names: str) -> list[Path]:
    """Remove the temporary files that :func:`atomic_path` left in ``folder``, in a process killed
    while it wrote a file whose final name matches the glob pattern ``final_names`` (``"best.keras"``,
    ``"epoch_*.keras"``); return them."""
    left = _temporaries(folder, final_names)
    for path in left:
        path.unlink()
    return left


def _temporaries(folder: os.PathLike | str, final_names: str) -> list[Path]:
    """The temporary files of :func:`atomic_path` for ``final_names`` (a glob pattern) in ``folder``, sorted."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.glob(f".{final_names}.*") if _TEMPORARY_FILE.match(path.name))


@contextlib.contextmanager
def held_atomic_path(path: os.PathLike | str, suffix: str = ".tmp") -> Iterator[Path]:
    """:func:`atomic_path`, for a writer whose temporary file may outlive it where no lock keeps
    the folder (a shared cache folder): the temporary file is created here and held under an
    operating-system lock (``flock``, which dies with its process, on every machine that shares
    the folder) until it is in place, so that :func:`remove_dead_temporaries` can tell a writer
    that was killed from one still writing. Open it without the writer's own file locking (h5py:
    ``locking=False``), which would collide with this lock."""
    fd = None
    try:
        with atomic_path(path, suffix) as tmp:
            fd = _create_held(tmp)
            yield tmp
    finally:
        if fd is not None:
            os.close(fd)  # after the move into place: the lock ends with the file at its final name


def _create_held(tmp: Path) -> int | None:
    """Create ``tmp`` and lock it; the open descriptor that holds the lock (None without ``flock``).
    A tidier that took the new file in the instant before the lock (it saw no holder) removes it:
    then it is made again."""
    for _ in range(100):
        try:
            fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o666)
        except FileExistsError:  # the previous attempt's file, which a tidier is removing
            time.sleep(0.01)
            continue
        if fcntl is None:
            os.close(fd)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.stat(tmp), os.fstat(fd)):
                return fd  # locked, and still the file at that name
        except (BlockingIOError, FileNotFoundError):
            pass
        os.close(fd)
    raise OSError(errno.EAGAIN, "could not create and lock a temporary file", str(tmp))


def remove_dead_temporaries(folder: os.PathLike | str, final_names: str) -> list[Path]:
    """Remove the temporary files that writers of ``final_names`` (a glob pattern) left in
    ``folder`` when they were killed, and return them: those nobody holds (:func:`held_atomic_path`;
    a live writer's is locked, and kept). Without ``flock`` (not POSIX) nothing is removed."""
    if fcntl is None:
        return []
    removed = []
    for path in _temporaries(folder, final_names):
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:  # gone meanwhile (moved into place), or not ours to open
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.stat(path), os.fstat(fd)):  # not moved into place meanwhile
                path.unlink()
                removed.append(path)
        except (BlockingIOError, FileNotFoundError):  # held by a live writer, or moved into place
            pass
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def naming_path(path: os.PathLike | str, also: os.PathLike | str | None = None) -> Iterator[None]:
    """Inside: an ``OSError`` without a file name (or naming ``also``, a temporary name) is raised
    again as the same error about ``path``, so that its one-line message says what was written."""
    try:
        yield
    except OSError as error:
        if isinstance(error, UserError) or (error.filename is not None and str(error.filename) != str(also)):
            raise
        raise OSError(error.errno, error.strerror or str(error) or type(error).__name__, str(path)) from error


def write_text_atomic(path: os.PathLike | str, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` atomically (with the usual umask permissions, or ``mode``: 0o600
    for a file only its owner may read, which the temporary file has from its creation on)."""
    with atomic_path(path) as tmp:
        if mode is None:
            handle = open(tmp, "w", newline="")
        else:
            handle = os.fdopen(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_EXCL, mode), "w", newline="")
        with handle:
            handle.write(text)


def new_folder_beside(final: os.PathLike | str) -> Path:
    """A new, empty, hidden folder ``.<name>.tmp-<pid>`` beside ``final``, to fill and then move into
    place whole with :func:`replace_folder`. Leftovers of a killed process: :func:`tidy_folder`."""
    final = Path(final)
    tidy_folder(final)
    tmp = _beside(final, "tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def replace_folder(new: os.PathLike | str, final: os.PathLike | str) -> None:
    """Put the folder ``new`` (beside ``final``) at ``final``, replacing the folder there whole.

    On Linux the two are swapped in one step (``renameat2`` with ``RENAME_EXCHANGE``) and the old
    one then removed: a process killed at any moment leaves at ``final`` the old folder, complete,
    or the new one, complete. Where that call is missing (another system, a file system without
    it) the old folder is first renamed to ``.<name>.old-<pid>``: killed in the instant between the
    two renames, ``final`` is absent and the old folder waits whole under that name, and
    :func:`tidy_folder` (called by the next :func:`new_folder_beside`) puts it back. Every file in
    ``new`` and its folders are made durable first, so a power cut after the swap leaves none empty.
    """
    new, final = Path(new), Path(final)
    for path in sorted(new.rglob("*"), reverse=True):  # files, then the folders that hold them
        _fsync_path(path)
    fsync_folder(new)
    if not final.exists():
        os.replace(new, final)
    elif _exchange(new, final):
        shutil.rmtree(new)  # now the old folder
    else:
        old = _beside(final, "old")
        os.replace(final, old)
        os.replace(new, final)
        shutil.rmtree(old)
    fsync_folder(final.parent)


def tidy_folder(final: os.PathLike | str) -> None:
    """After a process was killed while replacing ``final``: put the old folder back if ``final`` is
    missing, and remove the temporary and old folders left beside it."""
    final = Path(final)
    if not final.parent.is_dir():
        return
    left = _left_beside(final, "old")
    if left and not final.exists():
        os.replace(left.pop(), final)
    for path in left + _left_beside(final, "tmp"):
        shutil.rmtree(path, ignore_errors=True)


def folder_temporaries(final: os.PathLike | str) -> list[Path]:
    """The folders :func:`new_folder_beside` and :func:`replace_folder` left beside ``final`` in
    processes killed meanwhile (:func:`tidy_folder` removes them, or puts the old one back)."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    return _left_beside(final, "old") + _left_beside(final, "tmp")


def _beside(final: Path, kind: str) -> Path:
    """This process's hidden ``kind`` ("tmp": being filled; "old": being replaced) folder beside ``final``."""
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}")


def _left_beside(final: Path, kind: str) -> list[Path]:
    return sorted(final.parent.glob(f".{glob.escape(final.name)}.{kind}-*"))


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux's ``renameat2``); False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # a C library without it
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def fsync_folder(folder: Path) -> None:
    """Make a folder's entries durable (where the system allows opening a folder)."""
    _fsync_path(folder)


def _fsync_path(path: Path) -> None:
    """Make a file's contents, or a folder's entries, durable (where the system allows it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
