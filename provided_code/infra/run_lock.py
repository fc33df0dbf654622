"""One run at a time on a model folder: an exclusive lock held for the life of a run.

The lock is the operating system's (``fcntl.flock`` on a file in the folder; for a run's folder
``results/<model-name>/.lock``, :meth:`provided_code.run_folder.RunFolder.lock`), so it dies
with its process: a run killed with SIGKILL, or a lost machine, leaves nothing that blocks the
next. The file also says who holds it (process, host, what, since when), for the refusal's
message; it is never deleted (deleting a lock file races with the next process that opens it).

A process that only reads a model folder (an ensemble reading a member) takes the lock shared:
several readers at once, none while a run that writes (training, ``--predict-only``) holds it,
and no such run while a reader does. With several readers the file names the last to arrive.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from provided_code.errors import RunLockedError

logger = logging.getLogger(__name__)

try:
    import fcntl
except ImportError:  # not POSIX: no lock (said once per run)
    fcntl = None


class RunLock:
    """``with RunLock(folder / ".lock", "training"):`` holds the lock of the file's folder, or raises
    :class:`~provided_code.errors.RunLockedError` naming the folder and the process that holds it.
    ``shared``: for a process that only reads the folder (see the module docstring). ``advice``: what
    the refusal tells the user to do, instead of the default for a model folder."""

    def __init__(self, path: os.PathLike | str, what: str, shared: bool = False, advice: str | None = None):
        self.path = Path(path)
        self.folder = self.path.parent
        self.what = what
        self.shared = shared
        self.advice = advice
        self._fd = None

    def __enter__(self) -> "RunLock":
        if fcntl is None:
            logger.warning("No run lock on this platform: do not start two runs on %s", self.folder)
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that did not say"
            os.close(fd)
            advice = self.advice or ("wait for it to end before reading it" if self.shared else
                                     "wait for it to end, or use another --model-name or --results-dir")
            raise RunLockedError(f"{self.folder} is in use by another run ({holder}); {advice}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, {self.what} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


LOCKS_TABLE = Path("/proc/locks")  # Linux's table of the locks held on the machine


def is_held(path: os.PathLike | str) -> bool | None:
    """Whether some process holds a lock on the file at ``path`` (a :class:`RunLock`'s), asked
    without taking it (taking it, even shared for an instant, could refuse the owner starting at that
    instant): from Linux's table of locks. None where there is no such table to ask."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return False  # never locked: a lock file is never deleted
    try:
        table = LOCKS_TABLE.read_text()
    except OSError:
        return None
    # "1: FLOCK  ADVISORY  WRITE 17214 fe:00:2285571 0 EOF": major:minor:inode (a waiter's line has "->"
    # after its number). Matched by the inode alone: the device a file system reports to stat may not be
    # the one the table names (btrfs); another device's file of that inode, locked at that instant, is rare.
    inode = f":{info.st_ino}"
    return any(field.count(":") == 2 and field.endswith(inode) for line in table.splitlines()
               if "->" not in line.split()[1:2] for field in line.split()[5:7])
