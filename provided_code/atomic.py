"""Nothing half-written: every output is written beside its final name, then moved into place."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: os.PathLike | str, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path in ``path``'s folder; on success fsync it and move it to ``path``.

    On failure the temporary file is removed; a process killed meanwhile leaves only a hidden
    ``.<name>.<pid>.<random><suffix>`` file, never something at ``path``. ``suffix`` lets writers
    that insist on an extension (``.keras``, ``.png``) have it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: os.PathLike | str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (with the usual umask permissions)."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        handle.write(text)
