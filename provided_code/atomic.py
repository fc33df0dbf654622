"""Nothing half-written: every output is written beside its final name, then moved into place."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator

from provided_code.errors import UserError


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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}{suffix}")
    try:
        with naming_path(path, also=tmp):
            yield tmp
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


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


def write_text_atomic(path: os.PathLike | str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (with the usual umask permissions)."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        handle.write(text)
