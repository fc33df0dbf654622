"""This package's version, for what it writes into its outputs (an RT Dose's Software Versions)."""

from __future__ import annotations

import configparser
import functools
import importlib.metadata
from pathlib import Path

DISTRIBUTION = "provided_code"  # setup.cfg's metadata name
SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"  # a source checkout's


@functools.lru_cache(maxsize=None)
def package_version() -> str:
    """The installed distribution's version (setup.cfg's ``[metadata] version``, as pip recorded it);
    not installed (run from a source checkout), that of the checkout's setup.cfg; else ``unknown``."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        pass
    parser = configparser.ConfigParser()
    try:
        parser.read(SETUP_CFG, encoding="utf-8")
    except (OSError, configparser.Error):
        return "unknown"
    return parser.get("metadata", "version", fallback="unknown")
