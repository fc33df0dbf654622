"""Cache files for the tests: a test's own cache folder linked to the shared phantom cache, and a
cache file damaged in place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def linked_cache(phantom_cache: Path, folder: Path) -> Path:
    """``folder`` with hard links to ``phantom_cache``'s files, so that a run finds ``phantom_data``
    cached rather than parsing its CSVs again (what the cache tests test, not these). A cache that
    is rebuilt replaces its link (a new file moved into place), never the shared file; a test that
    damages a cache file in place damages one of its own (as the mapped 32³ files are), not a link."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in phantom_cache.iterdir():
        if path.suffix == ".h5":
            try:
                os.link(path, folder / path.name)
            except OSError:  # another file system
                shutil.copy2(path, folder / path.name)
    return folder


def flip_a_byte(path, volume: str, row: int) -> None:
    """Change one byte in the middle of patient ``row``'s ``volume`` chunk, size and time kept."""
    import h5py

    with h5py.File(path, "r") as h5:
        chunk = h5[volume].id.get_chunk_info_by_coord((row, 0, 0, 0))
    flip_bits_at(path, chunk.byte_offset + chunk.size // 2 + 3, 0x10)


def flip_a_table_byte(path, table: str, row: int) -> None:
    """Flip the lowest bit of the first byte of patient ``row``'s entry in a per-patient table
    (has_dose 1 -> 0, dose_decimals 3 -> 2, a voxel spacing by an ulp), size and time kept."""
    import h5py
    import numpy as np

    with h5py.File(path, "r") as h5:
        dataset = h5[table]
        position = dataset.id.get_offset() + row * dataset.dtype.itemsize * int(np.prod(dataset.shape[1:]))
    flip_bits_at(path, position, 0x01)


def flip_bits_at(path, position: int, mask: int) -> None:
    """XOR the byte at ``position`` of the file at ``path`` with ``mask``, its size and times kept
    (a cache file damaged in place, as a disk would)."""
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ mask]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
