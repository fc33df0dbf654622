"""The DICOM node as a process that holds each prediction's outputs uncommitted while a file
exists, so that a test can kill it mid-prediction (its outputs written, not yet in place).

The seam is the store's commit (:meth:`provided_code.apps.node.store.Store.commit_result`),
wrapped in this process only: the node itself holds no code for it. Run as::

    python -c "from tests.kit.held_node import main; main()" HOLD_FILE serve --model-dir ...

with the repository's root on ``PYTHONPATH``; the arguments after ``HOLD_FILE`` are
``openkbp-dicom``'s.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

HOLD_AT_MOST_S = 600.0  # a test that forgot its hold file does not leave a node waiting forever

COMMAND = "from tests.kit.held_node import main; main()"  # for ``python -c``


def hold_commits(hold: Path) -> None:
    """Make every commit of the node's store in this process wait while ``hold`` exists."""
    from provided_code.apps.node.store import Store

    commit = Store.commit_result

    def held(self, staging, structure_set_uid):
        # The hold ignores the node's stop event: a held node sent SIGTERM finishes this wait (until
        # the hold file goes, at most HOLD_AT_MOST_S) before it stops.
        deadline = time.monotonic() + HOLD_AT_MOST_S
        while hold.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return commit(self, staging, structure_set_uid)

    Store.commit_result = held


def main() -> None:
    hold, *arguments = sys.argv[1:]
    hold_commits(Path(hold))
    from provided_code.apps.dicom_cli import main as openkbp_dicom

    openkbp_dicom(args=arguments, prog_name="openkbp-dicom")
