"""Where the tests find the repository's files and the real OpenKBP sample, and how they run a
console script as ``setup.cfg`` declares it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE_DIR = Path(os.environ.get("OPENKBP_SAMPLE_DIR", REPO.parent / "shared" / "openkbp-sample"))


def console_script(name: str) -> list[str]:
    """The command line that runs the console script ``name`` as setup.cfg declares it, in this
    Python (an installed script may predate a move of its module until the next ``pip install -e``)."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    scripts = dict(line.split(" = ") for line in parser["options.entry_points"]["console_scripts"].strip().splitlines())
    module, function = scripts[name].split(":")
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; {function}()"]
