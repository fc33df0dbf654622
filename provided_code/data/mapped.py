"""A split's volumes as views into its cache file, for cohorts larger than memory (``--memory-map``).

The cache (:mod:`provided_code.data.cache`) stores every volume uncompressed, one HDF5 chunk per
patient, each with its checksum (:mod:`provided_code.data.chunks`). :class:`MappedVolumes` maps
the file into memory and finds each patient's bytes at the offset HDF5 reports, so that:

- ``volumes[rows]`` (a batch's fancy index) copies only those patients' bytes out of the mapping:
  the operating system reads them from disk on first use and keeps what is hot in its page cache,
  which it gives back under memory pressure (the process holds no copy of the split);
- ``volumes[row]`` is a read-only view of one patient, nothing copied;
- each chunk's checksum is verified once per process, on its first touch; a chunk that fails is a
  :class:`~provided_code.data.chunks.CacheError` naming the file, the patient and the volume, and
  the file is removed so that the next run rebuilds it;
- ``volumes.subset(rows)`` maps fewer patients (``SplitArrays.select``), reading nothing.

Training at 64³ or 32³ maps a second file beside the 128³ one, ``<cache>-<R>.h5``: the same
layout with every patient block-averaged exactly as in memory (:func:`downsampled`), written once,
patient by patient, and rewritten when the 128³ cache's contents change.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import mmap
import os
import threading
from pathlib import Path

import h5py
import numpy as np

from provided_code.data.chunks import CacheError, chunk_checksum, chunk_offsets, new_cache_file
from provided_code.data.resample import check_resolution, downsample_patient
from provided_code.data.split_arrays import VOLUME_NAMES, SplitArrays
from provided_code.errors import UserError

logger = logging.getLogger(__name__)

DERIVED_FORMAT_VERSION = 1

_lock = threading.Lock()
_verified: dict[tuple, set[int]] = {}  # file identity -> byte offsets of the chunks verified in this process


class CorruptChunkError(UserError, CacheError):
    """A mapped patient's chunk fails its checksum when first touched (found mid-run, it cannot be
    rebuilt then; the file is removed so that the next run rebuilds it)."""


def _identity(stat: os.stat_result) -> tuple:
    return stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns


class _MappedFile:
    """One cache file mapped read-only, and which of its chunks this process has verified."""

    def __init__(self, path: Path):
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            stat = os.fstat(fd)
            self.size = stat.st_size
            self.identity = _identity(stat)
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if self.size else None
        finally:
            os.close(fd)  # the mapping keeps the file (even once replaced or removed)
        with _lock:
            self.verified = _verified.setdefault(self.identity, set())
        self.failure: CorruptChunkError | None = None  # the first chunk of this mapping that failed

    def view(self, offset: int, dtype: np.dtype, shape: tuple) -> np.ndarray:
        return np.frombuffer(self.map, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)

    def prefetch(self, offset: int, length: int) -> None:
        """Ask the kernel to start reading ``length`` bytes at ``offset`` (a cold batch's chunks
        are then read together rather than one page fault at a time)."""
        start = offset - offset % mmap.PAGESIZE
        try:
            self.map.madvise(mmap.MADV_WILLNEED, start, offset + length - start)
        except (AttributeError, OSError, ValueError):  # not on every platform: only slower
            pass

    def fail(self, problem: str) -> CorruptChunkError:
        """The error for a chunk that fails its checksum; the file is removed (if it is still the
        one mapped) so that the next run rebuilds it."""
        error = CorruptChunkError(f"{self.path}: {problem} fails its checksum (the file changed on disk); the file "
                           f"is removed, the next run rebuilds it")
        try:
            if _identity(os.stat(self.path)) == self.identity:
                os.unlink(self.path)
        except OSError:
            pass
        self.failure = self.failure or error
        return error


def corrupt_chunk_error(*splits: SplitArrays | None) -> CorruptChunkError | None:
    """The first chunk of the mapped ``splits`` that failed its checksum (the input pipeline
    raises it in TensorFlow's thread, which reports it wrapped), or None."""
    for split in splits:
        for name in VOLUME_NAMES if split is not None else ():
            volume = getattr(split, name)
            if isinstance(volume, MappedVolumes) and volume._file.failure is not None:
                return volume._file.failure
    return None


class MappedVolumes:
    """One volume of a split's patients (``(N, R, R, R)``, patients first) in a mapped cache file.

    Indexing returns numpy arrays: ``[row]`` a read-only view, ``[rows]`` / ``[start:stop]`` a
    copy of those patients; either verifies a chunk's checksum the first time this process
    touches it.
    """

    def __init__(self, file: _MappedFile, name: str, dtype, row_shape: tuple, offsets, checksums, patient_ids):
        self._file = file
        self.name = name
        self.dtype = np.dtype(dtype)
        self._row_shape = tuple(row_shape)
        self._offsets = np.asarray(offsets, np.int64)
        self._checksums = np.asarray(checksums, np.uint64)
        self._patient_ids = list(patient_ids)
        self._row_bytes = self.dtype.itemsize * int(np.prod(self._row_shape))

    # -- what numpy code reads of an array --
    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def shape(self) -> tuple:
        return (len(self._offsets), *self._row_shape)

    @property
    def ndim(self) -> int:
        return 1 + len(self._row_shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def nbytes(self) -> int:
        """What the volume would take in memory (it takes none: its pages are the file's)."""
        return len(self) * self._row_bytes

    def __len__(self) -> int:
        return len(self._offsets)

    def __repr__(self) -> str:
        return f"MappedVolumes({self.name}, shape={self.shape}, dtype={self.dtype}, file={self.path})"

    def __array__(self, dtype=None, copy=None):
        whole = self[:]
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            if not key:
                return self[:]
            first = self[key[0]]
            return first[(slice(None), *key[1:])] if np.ndim(key[0]) or isinstance(key[0], slice) else first[key[1:]]
        if key is Ellipsis:
            return self[:]
        if isinstance(key, (int, np.integer)):
            return self._one(self._row(key))
        if isinstance(key, slice):
            return self._copy(np.arange(len(self))[key])
        rows = np.asarray(key)
        if rows.dtype == bool:
            if rows.shape != (len(self),):
                raise IndexError(f"a boolean index of shape {rows.shape} for {len(self)} patients")
            rows = np.flatnonzero(rows)
        if rows.dtype.kind not in "iu":
            raise IndexError(f"only integers, slices and integer or boolean arrays index patients, not {rows.dtype}")
        return self._copy(rows)

    # -- mapping fewer patients, and what was checked --
    def subset(self, rows) -> "MappedVolumes":
        """The patients at ``rows``, still mapped (nothing read)."""
        rows = np.asarray(rows, np.int64)
        return MappedVolumes(self._file, self.name, self.dtype, self._row_shape, self._offsets[rows],
                             self._checksums[rows], [self._patient_ids[row] for row in rows])

    def verified_rows(self) -> np.ndarray:
        """The rows whose chunk this process has verified (touched at least once)."""
        with _lock:
            done = set(self._file.verified)
        return np.array([row for row, offset in enumerate(self._offsets) if int(offset) in done], np.int64)

    # -- reading --
    def _row(self, row) -> int:
        row = int(row)
        if not -len(self) <= row < len(self):
            raise IndexError(f"patient {row} is out of range for {len(self)} patients")
        return row % len(self)

    def _check(self, row: int, data: np.ndarray) -> None:
        """Verify ``data`` (row ``row``'s bytes) against its checksum, unless done in this process."""
        offset = int(self._offsets[row])
        if offset in self._file.verified:
            return
        if chunk_checksum(data) != self._checksums[row]:
            raise self._file.fail(f"patient {self._patient_ids[row]}'s {self.name} chunk")
        with _lock:
            self._file.verified.add(offset)

    def _one(self, row: int) -> np.ndarray:
        view = self._file.view(int(self._offsets[row]), self.dtype, self._row_shape)
        self._check(row, view)
        return view

    def _copy(self, rows: np.ndarray) -> np.ndarray:
        flat = [self._row(row) for row in rows.reshape(-1)]
        for row in flat:
            self._file.prefetch(int(self._offsets[row]), self._row_bytes)
        out = np.empty((len(flat), *self._row_shape), self.dtype)
        for i, row in enumerate(flat):
            out[i] = self._file.view(int(self._offsets[row]), self.dtype, self._row_shape)
            self._check(row, out[i])  # the copy, while its bytes are still in the processor's cache
        return out.reshape(*rows.shape, *self._row_shape)


def map_volumes(path: Path, layout: dict, patient_ids: list[str], row_shape: tuple) -> dict[str, MappedVolumes]:
    """``{name: MappedVolumes}`` for ``layout``, ``{name: (dtype, chunk offsets, checksums)}`` of
    one cache file (a :class:`CacheError` if a chunk lies beyond its end)."""
    try:
        file = _MappedFile(path)
    except OSError as error:
        raise CacheError(f"{path} cannot be mapped ({error})") from error
    volumes = {}
    for name, (dtype, offsets, checksums) in layout.items():
        volume = MappedVolumes(file, name, dtype, row_shape, offsets, checksums, patient_ids)
        if len(volume) and int(np.max(volume._offsets)) + volume._row_bytes > file.size:
            raise CacheError(f"{path} is truncated (a patient's {name} chunk ends beyond the file)")
        volumes[name] = volume
    return volumes


# -- the volumes at a lower training resolution: a file of their own, written once --------------------
def derived_path(source: Path, resolution: int) -> Path:
    """Where the ``resolution``³ volumes of the 128³ cache file ``source`` are kept."""
    return source.with_name(f"{source.stem}-{resolution}{source.suffix}")


def _derived_key(arrays: SplitArrays, resolution: int) -> str:
    """What the derived file must have been made from: its patients and their 128³ chunks' checksums."""
    content = {"format": DERIVED_FORMAT_VERSION, "resolution": resolution, "patients": arrays.patient_ids,
               "volumes": {name: [str(getattr(arrays, name).dtype), getattr(arrays, name)._checksums.tolist()]
                           for name in VOLUME_NAMES}}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def downsampled(arrays: SplitArrays, resolution: int) -> SplitArrays:
    """Memory-mapped ``arrays`` at ``resolution``³: the same values as
    :func:`~provided_code.data.resample.downsample_split` gives in memory, mapped from
    :func:`derived_path`, which is written (patient by patient) when missing or made from other data."""
    factor = check_resolution(resolution)
    if factor == 1:
        return arrays
    source = arrays.ct.path
    path = derived_path(source, resolution)
    key = _derived_key(arrays, resolution)
    try:
        volumes = _open_derived(path, key, arrays.patient_ids, resolution)
    except CacheError as error:
        if path.exists():
            logger.warning("Rewriting %s: %s", path, error)
        _write_derived(path, key, arrays, resolution, factor)
        volumes = _open_derived(path, key, arrays.patient_ids, resolution)
    return dataclasses.replace(arrays, **volumes)


def _write_derived(path: Path, key: str, arrays: SplitArrays, resolution: int, factor: int) -> None:
    count, shape = len(arrays), (resolution,) * 3
    logger.info("Writing the %d³ volumes of %d patients into %s (once)", resolution, count, path)
    with new_cache_file(path) as h5:
        datasets = {name: h5.create_dataset(name, (count, *shape), dtype=getattr(arrays, name).dtype,
                                            chunks=(1, *shape)) for name in VOLUME_NAMES}
        checksums = np.zeros((count, len(VOLUME_NAMES)), np.uint64)
        for row in range(count):
            low = downsample_patient(*(getattr(arrays, name)[row] for name in VOLUME_NAMES), factor)
            for column, name in enumerate(VOLUME_NAMES):
                volume = np.asarray(low[name], datasets[name].dtype)
                datasets[name][row] = volume
                checksums[row, column] = chunk_checksum(volume)
        h5.create_dataset("checksums", data=checksums)
        h5.attrs["format_version"] = DERIVED_FORMAT_VERSION
        h5.attrs["resolution"] = resolution
        h5.attrs["source"] = key
        h5.attrs["complete"] = True  # written last


def _open_derived(path: Path, key: str, patient_ids: list[str], resolution: int) -> dict[str, MappedVolumes]:
    if not path.is_file():
        raise CacheError(f"no file at {path}")
    try:
        with h5py.File(path, "r", locking=False) as h5:  # replaced whole, never written in place (cache.load_cache)
            if not h5.attrs.get("complete", False) or h5.attrs.get("source") != key:
                raise CacheError(f"{path} was made from other data, or is incomplete")
            count, shape = len(patient_ids), (resolution,) * 3
            checksums = h5["checksums"][()]
            if checksums.shape != (count, len(VOLUME_NAMES)):
                raise CacheError(f"{path}: checksums do not match {count} patients")
            layout = {}
            for column, name in enumerate(VOLUME_NAMES):
                dataset = h5[name]
                if dataset.shape != (count, *shape):
                    raise CacheError(f"{path}: dataset {name} has shape {dataset.shape}, expected {(count, *shape)}")
                layout[name] = (dataset.dtype, chunk_offsets(path, dataset, count), checksums[:, column])
    except CacheError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as error:
        raise CacheError(f"{path} is unreadable or truncated ({error})") from error
    return map_volumes(path, layout, patient_ids, shape)
