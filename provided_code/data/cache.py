"""A compact HDF5 cache of a dataset split, loaded into its stacked arrays
(:class:`~provided_code.data.split_arrays.SplitArrays`).

Parsing the CSVs of a patient takes tens of milliseconds; loading its cached record takes a few.
One cache file holds one split (``train-pats/``, ...), every array stacked patients first, one
HDF5 chunk per patient, uncompressed so that loading is plain reads, several at once:

===================== ============================ ========= ===============
dataset               shape                        dtype     per patient
===================== ============================ ========= ===============
ct                    (N, 128, 128, 128)           uint16    4 MiB
structure_masks       (N, 128, 128, 128)           uint16    4 MiB (bit k = site.names[k]; uint32 past 16)
possible_dose_mask    (N, 128, 128, 128)           bool      2 MiB
dose                  (N, 128, 128, 128)           float32   8 MiB (Gy; zeros without dose.csv)
has_dose              (N,)                         bool
dose_decimals         (N,)                         int8      (see below)
voxel_dimensions      (N, 3)                       float64   (mm)
structure_present     (N, structures)              bool
checksums             (N, 4)                       uint64    (one per volume, in the order above)
patient_ids           (N,)                         str
sources               (N,)                         str       (JSON {file name: SHA-256} of each file read)
prescriptions         (N, targets)                 float32   (Gy, NaN without the file; only if one has prescriptions.csv)
beam_angles           (N, slots)                   float32   (degrees, NaN unused or without the file; only if one has beams.csv)
===================== ============================ ========= ===============

The file records its site (attribute ``site``, the site's JSON); one without it was built before
sites existed and is ``openkbp``'s. A cache of another site is rebuilt, and the log says why.

Dose is stored as float32, within 2**-18 Gy of the CSV below 128 Gy. ``dose_decimals`` records
the fewest decimals (0 to 5) that write every value of the patient's ``dose.csv`` exactly (3 for
the challenge's data; -1 if none do): :func:`~provided_code.data.csv_io.exact_dose` rounds back to
the CSV's float64 values, exactly, since the float32 error is far below half a step of that grid.

The cache is trusted only if its format version, its build options and the size and modification
time of every source file match, every chunk's bytes match its checksum and every per-patient table
(``patient_ids``, ``checksums``, ``has_dose`` ... ``beam_angles``) matches its own (attribute
``table_checksums``: :func:`~provided_code.data.chunks.table_checksum`, checked whenever the file is
loaded, mapped or not); otherwise, or if it is truncated or unreadable, it is rebuilt (with a
warning naming the file). A cache of an earlier format is rebuilt, not read. The chunks'
checksum is the project's own (:func:`~provided_code.data.chunks.chunk_checksum`), not HDF5's
fletcher32 filter: chunks are loaded with parallel raw reads at the offsets HDF5 reports, which
bypass HDF5's filters, and are checked in the reading threads (``bench_data.py``: ``cache_load_checksum_over_plain``).
It is written to a temporary file beside its final name and moved into place, so a build killed
midway leaves nothing that looks valid; the next build removes the temporary file it left
(:func:`~provided_code.data.chunks.new_cache_file`). It never lives beside the CSVs.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import sys
from collections.abc import Collection
from pathlib import Path

import h5py
import numpy as np

from provided_code.constants import BEAMS_FILE, VOLUME_SHAPE
from provided_code.data.chunks import (
    CacheError,
    chunk_checksum,
    chunk_offsets,
    new_cache_file,
    read_chunks,
    table_checksum,
)
from provided_code.data.csv_io import Patient, PatientDataError, discover_patients, read_patient
from provided_code.data.mapped import map_volumes
from provided_code.data.split_arrays import (
    PLAN_TABLES,
    TABLES,
    VOLUMES,
    SplitArrays,
    plan_tables,
    present_structures,
    volume_dtypes,
)
from provided_code.errors import ConfigError
from provided_code.beams import beam_concerns
from provided_code.sites import Site, load_site, openkbp
from provided_code.infra.progress import Progress, no_progress

logger = logging.getLogger(__name__)

# 3: per-chunk checksums; 4: doses checked when read (no header-only or negative dose.csv, none
# outside the possible-dose mask), so a cache built before the check is rebuilt and checked;
# 5: the per-patient tables checksummed too (a cache of 4 cannot have its tables checked: rebuilt);
# 6: each patient's source files' SHA-256 as read (``sources``: what a fold records it trained on)
CACHE_FORMAT_VERSION = 6
# The per-patient tables beside the volumes, each checked against its checksum when read
# (attribute ``table_checksums``); the plan tables only where the file has them.
_CHECKED_TABLES = ("patient_ids", "checksums", "sources", *TABLES, *PLAN_TABLES)
# A pool of reader processes pays for its start (each spawned worker imports the readers: about half a
# second, once TensorFlow runs here) only on a larger split: on 2 cores, 20 real OpenKBP patients
# were cached in 1.3 s by this process and in 1.7 s with a pool of two.
POOL_MIN_PATIENTS = 32


def default_cache_dir() -> Path:
    """``$OPENKBP_CACHE_DIR``, else ``$XDG_CACHE_HOME/provided_code``, else ``~/.cache/provided_code``."""
    if os.environ.get("OPENKBP_CACHE_DIR"):
        return Path(os.environ["OPENKBP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "provided_code"


def cache_path_for(split_dir: os.PathLike | str, cache_dir: os.PathLike | str | None = None, *, site: Site) -> Path:
    """Where the cache of ``split_dir`` lives: named after the split, keyed by its absolute path
    and, for a site other than OpenKBP, by the site (so that models of two sites, or two versions
    of one, on the same folder each keep their cache instead of rebuilding it in turn)."""
    split_dir = Path(split_dir).resolve()
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    text = str(split_dir)
    if not site.same_as(openkbp()):  # OpenKBP's keep the name they had before sites
        text += "\n" + json.dumps(site.model_dict(), sort_keys=True)  # goals and optional targets are not the data's
    key = hashlib.sha256(text.encode()).hexdigest()[:12]
    return cache_dir / f"{split_dir.name}-{key}.h5"


def source_fingerprint(folders: list[Path]) -> str:
    """Size and modification time of every file in every patient folder, as canonical JSON."""
    entries = {}
    for folder in folders:
        files = {}
        for entry in sorted(os.scandir(folder), key=lambda e: e.name):
            if entry.is_file():
                stat = entry.stat()
                files[entry.name] = [stat.st_size, stat.st_mtime_ns]
        entries[folder.name] = files
    return json.dumps(entries, sort_keys=True)


def load_split(
    split_dir: os.PathLike | str,
    cache_dir: os.PathLike | str | None = None,
    require_dose: bool = True,
    skip_incomplete: bool = False,
    progress: Progress = no_progress,
    workers: int | None = None,
    *,
    site: Site,
    memory_map: bool = False,
    leave_out: Collection[str] = (),
) -> SplitArrays:
    """The split's stacked arrays at 128³, from its cache, (re)building the cache when needed.
    ``site``: the data's site; each site has its cache (:func:`cache_path_for`), and one that
    records another site is rebuilt.

    ``require_dose``: a patient without ``dose.csv`` is an error (or, with ``skip_incomplete``,
    skipped). ``skip_incomplete``: patients with missing or malformed files are left out and
    listed in ``SplitArrays.skipped`` instead of raising :class:`PatientDataError`.
    ``leave_out``: patients the caller leaves out anyway (a training run's ``--exclude``): their
    missing or malformed files never raise; such a patient is left out and listed in
    ``SplitArrays.skipped`` (one whose files are fine is read as any other).
    ``memory_map``: the volumes are views into the cache file, read and checked as touched
    (:mod:`provided_code.data.mapped`), rather than read into memory.
    """
    split_dir = Path(split_dir)
    folders = discover_patients(split_dir)
    path = cache_path_for(split_dir, cache_dir, site=site)
    fingerprint = source_fingerprint(folders)
    try:
        arrays = load_cache(path, fingerprint=fingerprint, skip_incomplete=skip_incomplete, site=site,
                            mapped=memory_map, leave_out=leave_out)
        logger.info("%s %d patients of %s from cache %s", "Mapped" if memory_map else "Loaded", len(arrays),
                    split_dir, path)
    except CacheError as error:
        if path.exists():
            logger.warning("Rebuilding cache %s: %s", path, error)
        build_cache(split_dir, path, folders, fingerprint, skip_incomplete, progress, workers, site=site,
                    leave_out=leave_out)
        arrays = load_cache(path, fingerprint=fingerprint, skip_incomplete=skip_incomplete, site=site,
                            mapped=memory_map, leave_out=leave_out)

    if require_dose and not arrays.has_dose.all():
        missing = [pid for pid, has in zip(arrays.patient_ids, arrays.has_dose) if not has]
        needed = [pid for pid in missing if pid not in leave_out]  # those left out anyway need none
        if needed and not skip_incomplete:
            raise PatientDataError(needed[0], split_dir / needed[0] / "dose.csv",
                                   "file is missing (a dose is required for training)")
        skipped = dict(arrays.skipped)
        skipped.update({pid: "dose.csv is missing" for pid in missing})
        arrays = arrays.select(np.flatnonzero(arrays.has_dose))
        arrays.skipped = skipped
    left_out = {pid: why for pid, why in arrays.skipped.items() if pid in leave_out}
    incomplete = {pid: why for pid, why in arrays.skipped.items() if pid not in leave_out}
    if left_out:  # the caller's own: said once, not as a problem
        logger.info("%d patient(s) of %s left out by --exclude, their files not read: %s", len(left_out), split_dir,
                    "; ".join(f"{pid} ({why})" for pid, why in left_out.items()))
    if incomplete:
        logger.warning(
            "Skipped %d incomplete patient(s) of %s: %s", len(incomplete), split_dir,
            "; ".join(f"{pid} ({why})" for pid, why in incomplete.items()),
        )
    if len(arrays) == 0:
        raise PatientDataError("(all)", split_dir, "no complete patient is left after skipping")
    arrays.folder = split_dir
    _warn_of_patients_beams(arrays)
    return arrays


def _warn_of_patients_beams(arrays: SplitArrays) -> None:
    """The warning a run's own beams get (:func:`~provided_code.beams.beam_concerns`: too
    many, or closer than the grid resolves), for the patients' own ``beams.csv``: one line per
    split, naming the first such patient's file and how many others. At the 128³ grid the angles
    are kept at; a run at a coarser resolution resolves fewer (its own beams are checked at it)."""
    if arrays.beam_angles is None:
        return
    concerned = []
    for patient_id, angles in zip(arrays.patient_ids, arrays.beam_angles):
        concerns = beam_concerns(tuple(float(a) for a in angles[~np.isnan(angles)]), VOLUME_SHAPE[0])
        if concerns:
            concerned.append((patient_id, concerns))
    if concerned:
        patient_id, concerns = concerned[0]
        others = f" ({len(concerned) - 1} other patient(s) of the split too)" if len(concerned) > 1 else ""
        logger.warning("Patient %s: %s: %s%s", patient_id, arrays.folder / patient_id / BEAMS_FILE, "; ".join(concerns),
                       others)


def _read_or_error(folder: Path, site: Site) -> Patient | PatientDataError:
    try:
        return read_patient(folder, require_dose=False, site=site)
    except PatientDataError as error:
        return error


def build_cache(
    split_dir: Path,
    path: Path,
    folders: list[Path],
    fingerprint: str,
    skip_incomplete: bool,
    progress: Progress = no_progress,
    workers: int | None = None,
    *,
    site: Site,
    leave_out: Collection[str] = (),
) -> None:
    """Parse every patient folder of ``site`` and write the cache atomically to ``path``: in
    ``workers`` processes (default: one per core from ``POOL_MIN_PATIENTS`` patients, else this one).
    A patient whose files cannot be read stops it, unless ``skip_incomplete`` or it is one of
    ``leave_out``: then it is left out, and the file's ``skipped`` says why."""
    if path.parent.resolve() == split_dir.resolve() or split_dir.resolve() in path.resolve().parents:
        raise ConfigError(f"Invalid `cache_dir`. Expected a folder outside the data folder {split_dir}. "
                          f"Received: cache_dir={path.parent}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not workers:
        workers = (os.cpu_count() or 1) if len(folders) >= POOL_MIN_PATIENTS else 1
    workers = max(1, min(workers, len(folders)))
    count = len(folders)
    skipped: dict[str, str] = {}
    with new_cache_file(path) as h5:
        volumes = {
            name: h5.create_dataset(name, (count, *VOLUME_SHAPE), dtype=dtype,
                                    maxshape=(None, *VOLUME_SHAPE), chunks=(1, *VOLUME_SHAPE))
            for name, dtype in volume_dtypes(site).items()
        }
        has_dose = np.zeros(count, bool)
        dose_decimals = np.full(count, -1, np.int8)
        voxel_dimensions = np.zeros((count, 3))
        structure_present = np.zeros((count, len(site.names)), bool)
        checksums = np.zeros((count, len(VOLUMES)), np.uint64)
        patient_ids: list[str] = []
        sources: list[str] = []  # each patient's {file name: SHA-256}, as JSON
        plans = []  # (prescriptions, gantry_angles) of each kept patient
        with PatientReader(workers, site) as read:
            for result in progress(read(folders), count, f"Caching {split_dir.name}"):
                if isinstance(result, PatientDataError):
                    if not skip_incomplete and result.patient_id not in leave_out:
                        raise result
                    skipped[result.patient_id] = f"{Path(result.path).name}: {result.problem}"
                    continue
                row = len(patient_ids)
                patient_ids.append(result.patient_id)
                sources.append(json.dumps(result.sources, sort_keys=True))
                volumes["ct"][row] = result.ct
                volumes["structure_masks"][row] = result.structure_masks
                volumes["possible_dose_mask"][row] = result.possible_dose_mask
                # written even when absent (zeros), so that every patient's chunk exists on disk
                dose = result.dose if result.dose is not None else np.zeros(VOLUME_SHAPE, np.float32)
                volumes["dose"][row] = dose
                checksums[row] = [chunk_checksum(np.asarray(volume, dtype))
                                  for volume, dtype in zip((result.ct, result.structure_masks,
                                                            result.possible_dose_mask, dose),
                                                           volume_dtypes(site).values())]
                if result.dose is not None:
                    has_dose[row] = True
                    dose_decimals[row] = result.dose_decimals
                voxel_dimensions[row] = result.voxel_dimensions
                structure_present[row] = present_structures(result.structure_masks, len(site.names))
                plans.append(dataclasses.replace(result, ct=None, structure_masks=None, possible_dose_mask=None,
                                                 dose=None, sources=None))
        kept = len(patient_ids)
        for dataset in volumes.values():
            dataset.resize(kept, axis=0)
        h5.create_dataset("has_dose", data=has_dose[:kept])
        h5.create_dataset("dose_decimals", data=dose_decimals[:kept])
        h5.create_dataset("voxel_dimensions", data=voxel_dimensions[:kept])
        h5.create_dataset("structure_present", data=structure_present[:kept])
        h5.create_dataset("checksums", data=checksums[:kept])
        h5.create_dataset("patient_ids", data=np.array(patient_ids, dtype=object),
                          dtype=h5py.string_dtype())
        h5.create_dataset("sources", data=np.array(sources, dtype=object), dtype=h5py.string_dtype())
        for name, table in plan_tables(plans, site).items():
            if table is not None:
                h5.create_dataset(name, data=table)
        h5.attrs["table_checksums"] = json.dumps({name: table_checksum(h5[name][()])  # as a reader reads them
                                                  for name in _CHECKED_TABLES if name in h5}, sort_keys=True)
        h5.attrs["site"] = json.dumps(site.to_dict(), sort_keys=True)
        h5.attrs["format_version"] = CACHE_FORMAT_VERSION
        h5.attrs["source_dir"] = str(split_dir.resolve())
        h5.attrs["fingerprint"] = fingerprint
        h5.attrs["skip_incomplete"] = skip_incomplete
        h5.attrs["skipped"] = json.dumps(skipped)
        h5.attrs["complete"] = True  # written last
    logger.info("Cached %d patients of %s in %s (%d skipped)", kept, split_dir, path, len(skipped))


class PatientReader:
    """Context manager yielding ``read(folders) -> iterator of Patient | PatientDataError``, in order."""

    def __init__(self, workers: int, site: Site):
        self.workers = workers
        self.site = site
        self.pool = None

    def __enter__(self):
        if self.workers > 1:
            # fork starts fast, but not once TensorFlow's threads run in this process: then spawn
            method = "spawn" if "tensorflow" in sys.modules else "fork"
            self.pool = concurrent.futures.ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context(method))
            return lambda folders: self.pool.map(_read_or_error, folders, [self.site] * len(folders))
        return lambda folders: map(_read_or_error, folders, [self.site] * len(folders))

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        return False


def load_cache(path: Path, fingerprint: str | None = None, skip_incomplete: bool | None = None,
               verify: bool = True, *, site: Site, mapped: bool = False,
               leave_out: Collection[str] = ()) -> SplitArrays:
    """Read a cache file into memory. Raises :class:`CacheError` if it is missing, stale, broken or
    of another site than ``site`` (a file without a site, written before sites existed, is
    OpenKBP's), or if, read with ``skip_incomplete`` False, it left out a patient that is not one of
    ``leave_out`` (built for a run that excluded it: this one would train without it unsaid).
    ``verify``: every chunk against its checksum (off only to measure what checking costs).
    ``mapped``: map the volumes instead (:class:`~provided_code.data.mapped.MappedVolumes`): each
    patient's chunk is read, and checked once, when first touched."""
    if not path.is_file():
        raise CacheError(f"no cache file at {path}")
    try:
        # without HDF5's own lock: a cache file is only ever replaced whole, and the writer that moved
        # it in holds its temporary's lock until just after the move (infra/atomic.held_atomic_path)
        with h5py.File(path, "r", locking=False) as h5:
            attrs = h5.attrs
            version = attrs.get("format_version")
            if version != CACHE_FORMAT_VERSION or not attrs.get("complete", False):
                raise CacheError(f"{path} has format {None if version is None else int(version)}, "
                                 f"expected {CACHE_FORMAT_VERSION}, or is incomplete")
            if fingerprint is not None and attrs["fingerprint"] != fingerprint:
                raise CacheError(f"{path} is stale: the source files changed since it was built")
            if skip_incomplete is not None and bool(attrs["skip_incomplete"]) != skip_incomplete:
                raise CacheError(f"{path} was built with skip_incomplete={bool(attrs['skip_incomplete'])}")
            built_for = load_site(json.loads(attrs["site"])) if "site" in attrs else openkbp()  # before sites: openkbp
            if not built_for.same_as(site):
                raise CacheError(f"{path} was built for site {built_for.name}, this run's site is {site.name}"
                                 + ("" if built_for.name != site.name else " (another version of it)"))
            tables = _checked_tables(path, h5)
            patient_ids = [p.decode() if isinstance(p, bytes) else p for p in tables["patient_ids"]]
            count = len(patient_ids)
            checksums = tables["checksums"]
            if checksums.shape != (count, len(VOLUMES)):
                raise CacheError(f"{path}: checksums do not match {count} patients")
            sources = [json.loads(text.decode() if isinstance(text, bytes) else text) for text in tables["sources"]]
            if len(sources) != count:
                raise CacheError(f"{path}: the sources table does not match {count} patients")
            arrays, reads, layout = {}, [], {}
            for column, (name, dtype) in enumerate(volume_dtypes(built_for).items()):
                dataset = h5[name]
                if dataset.shape != (count, *VOLUME_SHAPE) or dataset.dtype != np.dtype(dtype):
                    raise CacheError(f"{path}: dataset {name} has shape {dataset.shape} and dtype "
                                     f"{dataset.dtype}, expected {(count, *VOLUME_SHAPE)} {np.dtype(dtype)}")
                offsets = chunk_offsets(path, dataset, count)  # one uncompressed chunk per patient
                if mapped:
                    layout[name] = (dataset.dtype, offsets, checksums[:, column])
                    continue
                arrays[name] = np.empty(dataset.shape, dataset.dtype)
                reads += [(arrays[name][row], offsets[row], checksums[row, column] if verify else None,
                           f"patient {patient_ids[row]}'s {name} chunk") for row in range(count)]
            small = {name: tables.get(name) for name in (*TABLES, *PLAN_TABLES)}  # a plan table may be absent
            skipped = json.loads(attrs["skipped"])
            unread = sorted(set(skipped) - set(leave_out))
            if skip_incomplete is False and unread:
                raise CacheError(f"{path} was built leaving out {', '.join(unread)}, which this read does not")
        if mapped:
            arrays = map_volumes(path, layout, patient_ids, VOLUME_SHAPE)
        else:
            read_chunks(path, reads)
    except CacheError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as error:
        raise CacheError(f"{path} is unreadable or truncated ({error})") from error
    if small["voxel_dimensions"].shape != (count, 3) or small["has_dose"].shape != (count,):
        raise CacheError(f"{path}: per-patient tables do not match {count} patients")
    return SplitArrays(patient_ids=patient_ids, skipped=skipped, site=built_for, sources=sources, **arrays, **small)


def _checked_tables(path: Path, h5: h5py.File) -> dict[str, np.ndarray]:
    """The per-patient tables of an open cache file, each checked against the checksum the file
    records for it: a :class:`CacheError` naming the file and the table for one that fails (a flipped
    byte in a voxel spacing would change a DVH score silently, in ``has_dose`` drop a patient)."""
    try:
        recorded = json.loads(h5.attrs["table_checksums"])
    except (KeyError, ValueError, TypeError) as error:
        raise CacheError(f"{path}: its per-patient tables' checksums are missing or unreadable ({error})") from None
    tables = {name: h5[name][()] for name in _CHECKED_TABLES if name in h5}
    for name in _CHECKED_TABLES:
        if (name in tables) != (name in recorded):
            raise CacheError(f"{path}: the {name} table is {'not ' if name in recorded else ''}in the file, "
                             f"its checksums say otherwise")
        if name in tables and table_checksum(tables[name]) != recorded[name]:
            raise CacheError(f"{path}: the {name} table fails its checksum (the file changed on disk)")
    return tables

