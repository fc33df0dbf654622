"""What the node writes into its log and journal about what the network sent: one line each.

Tag text from a data set (a PatientID, a UID that is not one, an AE title) and the messages of
errors (an OSError naming a long path, a library's message with a traceback in it) are reduced to
one line of printable characters of bounded length before they are logged or journaled, so that
one event is one log line whatever a client sends; and an event a client repeats is said once, its
repeats summed up (:class:`RepeatedLines`).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from provided_code.errors import UserError

TAG_LIMIT = 64  # characters of a tag's text (a UID or a PatientID is at most 64)
ERROR_LIMIT = 400  # characters of an error's message


def text_of(value) -> str:
    """A tag's value as stripped text ('' for None)."""
    return "" if value is None else str(value).strip()


def printable(value, limit: int = TAG_LIMIT) -> str:
    """``value`` as text for a log line: control characters (an ESC, a newline) replaced by ``?``,
    at most ``limit`` characters (longer: cut, ending in ``...``)."""
    text = "".join(c if c.isprintable() else "?" for c in text_of(value))
    return text if len(text) <= limit else text[:limit - 3] + "..."


def one_line(error: BaseException, limit: int = ERROR_LIMIT, within: os.PathLike | str | None = None) -> str:
    """An error as one printable line of at most ``limit`` characters: a user error's or OSError's
    own message (an OSError's file by its name only, not its whole path), anything else with its
    type; only the message's first line (what follows is a library's traceback or detail). Paths
    inside the folder ``within`` (the store) are named relative to it."""
    if isinstance(error, OSError) and not isinstance(error, UserError) and error.strerror:
        text = f"[Errno {error.errno}] {error.strerror}"
        if error.filename is not None:
            text += f": {Path(str(error.filename)).name}"
    elif isinstance(error, (UserError, OSError)):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}"
    if within is not None:
        text = text.replace(f"{os.fspath(within).rstrip(os.sep)}{os.sep}", "")
    first = next((line for line in text.splitlines() if line.strip()), "")
    return printable(" ".join(first.split()), limit)


def duration(seconds: float) -> str:
    """``seconds`` as a person says it: two digits below ten seconds, whole units above (``0.05 s``,
    ``2.5 s``, ``12 s``, ``1 min 20 s``, ``5 min``, ``2 h 5 min``, ``24 h``; not ``1.33333 min``)."""
    if seconds < 9.5:
        return f"{seconds:.2g} s"
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        minutes, rest = divmod(total, 60)
        return f"{minutes} min" + (f" {rest} s" if rest else "")
    hours, minutes = divmod(round(total / 60), 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


class RepeatedLines:
    """Log lines said once per key and window: the first at once, its repeats within ``window``
    seconds counted and summed up in one line when the window closes (or at :meth:`flush`), so that
    a client that insists (reconnecting every few seconds) is a line a minute, not hundreds."""

    def __init__(self, log: logging.Logger, window: float = 60.0):
        self.log, self.window = log, window
        self._lock = threading.Lock()
        self._open: dict[object, list] = {}  # key -> [level, summary, repeats, timer]

    def say(self, key, level: int, summary: str, message: str, *args) -> None:
        """Log ``message % args`` unless ``key`` was said within the window; then count it, and
        ``summary`` (what happened, without the count) says how often when the window closes."""
        with self._lock:
            entry = self._open.get(key)
            if entry is not None:
                entry[2] += 1
                return
            timer = threading.Timer(self.window, self._close, (key,))
            timer.daemon = True
            self._open[key] = [level, summary, 0, timer]
        timer.start()
        self.log.log(level, message, *args)

    def _close(self, key) -> None:
        with self._lock:
            entry = self._open.pop(key, None)
        if entry is not None and entry[2]:
            self.log.log(entry[0], "%s: %d more time(s) within %g s", entry[1], entry[2], self.window)

    def flush(self) -> None:
        """Close every window now (at the node's stop)."""
        with self._lock:
            keys = list(self._open)
        for key in keys:
            with self._lock:
                entry = self._open.get(key)
            if entry is not None:
                entry[3].cancel()
            self._close(key)
