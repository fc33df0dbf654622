"""A file's SHA-256, read in blocks: what records a checkpoint (a model card's, a fine-tune's
parent) and finds it changed since. Importing this module imports nothing of TensorFlow."""

from __future__ import annotations

import hashlib
import os


def file_checksum(path: os.PathLike | str) -> str:
    """SHA-256 of a file, read in blocks (a checkpoint is hundreds of MB at 128³)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
