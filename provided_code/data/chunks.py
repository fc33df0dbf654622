"""The chunk layout of the cache files: one raw HDF5 chunk per patient and volume, and the checksums.

Both the 128³ cache (:mod:`provided_code.data.cache`) and the files that memory-map it or hold it
at a lower resolution (:mod:`provided_code.data.mapped`) store each patient's volume as one
uncompressed, unfiltered chunk, so that it can be read (or mapped) at the byte offset HDF5 reports,
with plain parallel reads that bypass HDF5's filters; and each chunk carries the project's own
checksum (:func:`chunk_checksum`), checked where the bytes are read. The small per-patient tables
beside the volumes (patient ids, voxel spacings, ...) are read whole through HDF5 and carry a
digest of their own (:func:`table_checksum`).

Each file is written whole (:func:`new_cache_file`): into a hidden temporary beside it, moved into
place when complete. A writer killed midway (SIGKILL, a lost machine) leaves its temporary, as big
as the file; the next writer of that file removes it, and never a live writer's, whose temporary
is locked while it writes (:func:`~provided_code.infra.atomic.held_atomic_path`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob
import hashlib
import logging
import os
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from provided_code.infra.atomic import held_atomic_path, remove_dead_temporaries

logger = logging.getLogger(__name__)


class CacheError(RuntimeError):
    """A cache file is missing, stale, truncated or unreadable (it will be rebuilt)."""


def chunk_checksum(array: np.ndarray) -> np.uint64:
    """The checksum of one patient's volume as stored: its bytes as 64-bit words, summed modulo
    2⁶⁴. Any change inside one word (a flipped bit or byte) changes it; one pass at memory speed,
    where HDF5's fletcher32 filter would need HDF5's own read path (see the module docstring)."""
    return np.add.reduce(np.ascontiguousarray(array).reshape(-1).view(np.uint64), dtype=np.uint64)


def table_checksum(table: np.ndarray) -> str:
    """The checksum of a small per-patient table as read back (its dtype, shape and bytes; text
    as fixed-width unicode): a BLAKE2b digest, in hex. A table is a few hundred bytes per patient,
    read whole: the digest's cost does not matter, and it sees any change, not only one in a word."""
    table = np.asarray(table)
    if table.dtype == object:  # HDF5 variable-length strings: bytes or str
        table = np.array([v.decode() if isinstance(v, bytes) else v for v in table.reshape(-1)], np.str_)
    table = np.ascontiguousarray(table)
    digest = hashlib.blake2b(f"{table.dtype.str} {table.shape}".encode(), digest_size=16)
    digest.update(table.tobytes())
    return digest.hexdigest()


def chunk_offsets(path: Path, dataset: h5py.Dataset, count: int) -> list[int]:
    """Where each patient's bytes of ``dataset`` start in ``path``: one uncompressed chunk per
    patient, as HDF5 reports it (a :class:`CacheError` otherwise)."""
    row_bytes = dataset.dtype.itemsize * int(np.prod(dataset.shape[1:]))
    offsets = []
    for row in range(count):
        chunk = dataset.id.get_chunk_info_by_coord((row, *[0] * (dataset.ndim - 1)))
        if chunk.byte_offset is None or chunk.filter_mask != 0 or chunk.size != row_bytes:
            raise CacheError(f"{path}: dataset {dataset.name.lstrip('/')} is not stored one raw chunk per patient")
        offsets.append(chunk.byte_offset)
    return offsets


def read_chunks(path: Path, reads: list[tuple[np.ndarray, int, np.uint64 | None, str]]) -> None:
    """Fill each array from its byte offset in ``path``, several reads at once, and check each
    against its checksum (None: not checked) while its bytes are still in the processor's cache;
    ``reads``: ``(array, offset, checksum, what the chunk is)``, the last for the error's message.

    h5py serialises reads behind one lock; ``os.preadv`` and numpy's sum release the GIL, so
    threads copy patients in parallel (measured 1.7× faster than h5py on 2 cores, see
    scripts/bench_data.py).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        def read(job):
            array, offset, checksum, what = job
            view = memoryview(array).cast("B")
            if os.preadv(fd, [view], offset) != len(view):
                raise CacheError(f"{path} is truncated (a patient's chunk ends early)")
            if checksum is not None and chunk_checksum(array) != checksum:
                raise CacheError(f"{path}: {what} fails its checksum (the file changed on disk)")

        with concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
            list(pool.map(read, reads))
    finally:
        os.close(fd)


@contextlib.contextmanager
def new_cache_file(path: Path) -> Iterator[h5py.File]:
    """``path`` written whole: an HDF5 file open for writing on a temporary beside it, moved into
    place when the block ends (removed if it raises). First, the temporaries that writers of
    ``path`` killed midway left are removed (said in the log); a live writer's is kept."""
    removed = remove_dead_temporaries(path.parent, glob.escape(path.name))
    if removed:
        logger.info("Removed %d temporary file(s) left beside %s by writers killed midway: %s", len(removed), path,
                    ", ".join(p.name for p in removed))
    # HDF5's own file lock is off: the temporary's holder has the lock it would take
    with held_atomic_path(path) as tmp, h5py.File(tmp, "w", locking=False) as h5:
        yield h5

