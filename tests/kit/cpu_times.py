"""Each test's processor time, for finding where the suite's time goes (``--cpu-times=FILE``).

The whole suite is bound by processor time on 2 cores (docs/development.md): a test's wall time
says little when both workers compete for the cores, its processor time says what it costs.
One JSON line per test: ``id``, ``wall`` (s), ``self`` (s, the test's process, user and system,
setup and teardown included: a session fixture's making is charged to the test that made it) and
``children`` (s, the processes it started and waited for). The workers of pytest-xdist append to
the one file, one ``write`` a line; the run's start empties it.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest


def _processor_seconds() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuTimes:
    """The plugin: ``path`` the file of JSON lines; ``fresh``: empty it first (the run's controller)."""

    def __init__(self, path: os.PathLike | str, fresh: bool):
        self.path = Path(path)
        if fresh:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text("")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        own, children = _processor_seconds()
        start = time.monotonic()
        try:
            return (yield)
        finally:
            own_after, children_after = _processor_seconds()
            line = json.dumps({"id": item.nodeid, "wall": round(time.monotonic() - start, 3),
                               "self": round(own_after - own, 3), "children": round(children_after - children, 3)})
            handle = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(handle, (line + "\n").encode())
            finally:
                os.close(handle)
