"""A check a command makes before TensorFlow loads and any data is read: every folder it writes to can
be written. A typo or a read-only disk then costs a second, not TensorFlow's start-up and a cache
build."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from provided_code.errors import ConfigError


def check_writable(folder: os.PathLike | str, what: str) -> Path:
    """Create ``folder`` if needed and write and remove a file in it; a :class:`ConfigError`
    naming the folder and the reason if that fails."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ConfigError(f"Cannot write to the {what} {folder}: {error.strerror or error}") from None
    return folder
