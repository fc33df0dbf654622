"""A compact HDF5 cache of a dataset split, and its pre-stacked in-memory arrays.

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
prescriptions         (N, targets)                 float32   (Gy, NaN without the file; only if one has prescriptions.csv)
beam_angles           (N, slots)                   float32   (degrees, NaN unused or without the file; only if one has beams.csv)
===================== ============================ ========= ===============

The file records its site (attribute ``site``, the site's JSON); one without it was built before
sites existed and is ``openkbp``'s. A cache of another site is rebuilt, and the log says why.

Dose is stored as float32, within 2**-18 Gy of the CSV below 128 Gy. ``dose_decimals`` records
the fewest decimals (0 to 5) that write every value of the patient's ``dose.csv`` exactly (3 for
the challenge's data; -1 if none do): :func:`exact_dose` rounds back to the CSV's float64 values,
exactly, since the float32 error is far below half a step of that grid.

The cache is trusted only if its format version, its build options and the size and modification
time of every source file match, and every chunk's bytes match its checksum; otherwise, or if it
is truncated or unreadable, it is rebuilt (with a warning naming the file). The checksum is the
project's own (:func:`chunk_checksum`), not HDF5's fletcher32 filter: chunks are loaded with
parallel raw reads at the offsets HDF5 reports, which bypass HDF5's filters, and are checked in
the reading threads (``bench_data.py``: ``cache_load_checksum_over_plain``).
It is written to a temporary file beside its final name and moved into place, so a build killed
midway leaves nothing that looks valid. It never lives beside the CSVs.
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
from pathlib import Path

import h5py
import numpy as np

from provided_code.constants import VOLUME_SHAPE
from provided_code.data.csv_io import Patient, PatientDataError, discover_patients, read_patient
from provided_code.sites import Site, load_site, openkbp
from provided_code.infra.atomic import atomic_path
from provided_code.infra.progress import Progress, no_progress

logger = logging.getLogger(__name__)

# 3: per-chunk checksums; 4: doses checked when read (no header-only or negative dose.csv, none
# outside the possible-dose mask), so a cache built before the check is rebuilt and checked
CACHE_FORMAT_VERSION = 4
# A pool of reader processes pays for its start (each spawned worker imports the readers: about half a
# second, once TensorFlow runs here) only on a larger split: on 2 cores, 20 real OpenKBP patients
# were cached in 1.3 s by this process and in 1.7 s with a pool of two.
POOL_MIN_PATIENTS = 32
_VOLUMES = {"ct": np.uint16, "structure_masks": np.uint16, "possible_dose_mask": bool, "dose": np.float32}
_TABLES = ("has_dose", "dose_decimals", "voxel_dimensions", "structure_present")  # small per-patient arrays
_PLAN_TABLES = ("prescriptions", "beam_angles")  # per-patient plans: None when no patient has its own file


def present_structures(structure_masks: np.ndarray, count: int) -> np.ndarray:
    """``(count,)`` bool: which of the site's ``count`` structures a packed ``structure_masks``
    volume has voxels of."""
    bits = int(np.bitwise_or.reduce(structure_masks, axis=None))
    return np.array([(bits >> k) & 1 for k in range(count)], bool)


def plan_tables(patients: list, site: Site) -> dict[str, np.ndarray | None]:
    """What the patients' own plan files say (each patient with ``prescriptions`` and
    ``gantry_angles``, None without its file): ``prescriptions`` ``(N, len(site.targets))``
    float32 Gy (``read_prescriptions``' values: a target the file does not list has the site's)
    and ``beam_angles`` ``(N, slots)`` float32 degrees (NaN in unused slots); a patient without
    the file has a row of NaN, and each table is None when no patient has the file. What such a
    patient is given is the model's business, decided in one place: the input's default (the
    run's angles, the site's prescriptions), applied by :func:`provided_code.data.batches.patient_vectors`."""
    tables = {"prescriptions": None, "beam_angles": None}
    if any(p.prescriptions is not None for p in patients):
        table = np.full((len(patients), len(site.targets)), np.nan, np.float32)
        for row, patient in enumerate(patients):
            if patient.prescriptions is not None:
                table[row] = [patient.prescriptions[target] for target in site.targets]
        tables["prescriptions"] = table
    own = [p.gantry_angles for p in patients if p.gantry_angles is not None]
    if own:
        table = np.full((len(patients), max(1, max(map(len, own)))), np.nan, np.float32)
        for row, patient in enumerate(patients):
            if patient.gantry_angles is not None:
                table[row, :len(patient.gantry_angles)] = patient.gantry_angles
        tables["beam_angles"] = table
    return tables


def chunk_checksum(array: np.ndarray) -> np.uint64:
    """The checksum of one patient's volume as stored: its bytes as 64-bit words, summed modulo
    2⁶⁴. Any change inside one word (a flipped bit or byte) changes it; one pass at memory speed,
    where HDF5's fletcher32 filter would need HDF5's own read path (see the module docstring)."""
    return np.add.reduce(np.ascontiguousarray(array).reshape(-1).view(np.uint64), dtype=np.uint64)


class CacheError(RuntimeError):
    """A cache file is missing, stale, truncated or unreadable (it will be rebuilt)."""


def stacked_nbytes(patients: int, resolution: int = VOLUME_SHAPE[0], site: Site | None = None) -> int:
    """The bytes ``patients`` patients' volumes of ``site`` (default openkbp) take stacked in
    memory at ``resolution``³."""
    dtypes = _volume_dtypes(load_site(site)).values()
    return patients * sum(np.dtype(dtype).itemsize for dtype in dtypes) * resolution ** 3


def default_cache_dir() -> Path:
    """``$OPENKBP_CACHE_DIR``, else ``$XDG_CACHE_HOME/provided_code``, else ``~/.cache/provided_code``."""
    if os.environ.get("OPENKBP_CACHE_DIR"):
        return Path(os.environ["OPENKBP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "provided_code"


@dataclasses.dataclass
class SplitArrays:
    """A split's patients stacked into contiguous arrays, patients first (see the module table)."""

    patient_ids: list[str]
    ct: np.ndarray
    structure_masks: np.ndarray
    possible_dose_mask: np.ndarray
    dose: np.ndarray
    has_dose: np.ndarray
    dose_decimals: np.ndarray
    voxel_dimensions: np.ndarray  # mm, of the 128³ grid whatever the resolution
    structure_present: np.ndarray
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # patient id -> reason
    site: Site = dataclasses.field(default_factory=openkbp)  # what bit k of structure_masks is
    prescriptions: np.ndarray | None = None  # (N, len(site.targets)) float32 Gy; None: the site's for all
    beam_angles: np.ndarray | None = None  # (N, slots) float32 degrees, NaN unused; None: the run's for all
    # (both as the files say: NaN rows for patients without the file; see plan_tables)
    folder: Path | None = None  # the split's folder (load_split's), to name a patient's files in messages
    vectors: dict = dataclasses.field(default_factory=dict)  # InputSpec -> (N, length) float32: a model's per-patient
    # vector inputs made once for every patient (data.batches.fit_vectors), what take_inputs indexes

    def __len__(self) -> int:
        return len(self.patient_ids)

    @property
    def resolution(self) -> int:
        return self.ct.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in (*_VOLUMES, *_TABLES, *_PLAN_TABLES)
                   if getattr(self, name) is not None)

    @classmethod
    def from_patients(cls, patients: list[Patient], site: Site | None = None) -> "SplitArrays":
        """Patients of ``site`` (default openkbp) read from their folders, stacked (no cache; for
        a handful of patients)."""
        site = load_site(site)
        def dose(patient):
            return patient.dose if patient.dose is not None else np.zeros(VOLUME_SHAPE, np.float32)

        return cls(
            patient_ids=[p.patient_id for p in patients],
            ct=np.stack([p.ct for p in patients]),
            structure_masks=np.stack([p.structure_masks for p in patients]),
            possible_dose_mask=np.stack([p.possible_dose_mask for p in patients]),
            dose=np.stack([dose(p) for p in patients]),
            has_dose=np.array([p.dose is not None for p in patients]),
            dose_decimals=np.array([p.dose_decimals for p in patients], np.int8),
            voxel_dimensions=np.stack([p.voxel_dimensions for p in patients]),
            structure_present=np.stack([present_structures(p.structure_masks, len(site.names)) for p in patients]),
            site=site,
            **plan_tables(patients, site),
        )

    def select(self, rows: np.ndarray) -> "SplitArrays":
        """The patients at ``rows`` (a copy; of memory-mapped volumes, a mapping of those rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        return dataclasses.replace(
            self,
            patient_ids=[self.patient_ids[i] for i in rows],
            **{name: _take_rows(getattr(self, name), rows) for name in (*_VOLUMES, *_TABLES)},
            **{name: None if getattr(self, name) is None else getattr(self, name)[rows] for name in _PLAN_TABLES},
            vectors={spec: vectors[rows] for spec, vectors in self.vectors.items()},
            skipped=dict(self.skipped),
        )

    @property
    def memory_mapped(self) -> bool:
        """Whether the volumes are views into the cache file (:mod:`provided_code.data.mapped`)."""
        return hasattr(self.ct, "subset")


def _take_rows(array, rows: np.ndarray):
    """``array[rows]``; a memory-mapped volume stays mapped (no patient's bytes are read)."""
    return array.subset(rows) if hasattr(array, "subset") else array[rows]


def cache_path_for(split_dir: os.PathLike | str, cache_dir: os.PathLike | str | None = None,
                   site: Site | None = None) -> Path:
    """Where the cache of ``split_dir`` lives: named after the split, keyed by its absolute path
    and, for a site other than OpenKBP, by the site (so that models of two sites, or two versions
    of one, on the same folder each keep their cache instead of rebuilding it in turn)."""
    split_dir = Path(split_dir).resolve()
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    text = str(split_dir)
    if site is not None and not site.same_as(openkbp()):  # OpenKBP's keep the name they had before sites
        text += "\n" + json.dumps(site.model_dict(), sort_keys=True)  # goals are not the data's
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
    site: Site | str | None = None,
    memory_map: bool = False,
) -> SplitArrays:
    """The split's stacked arrays at 128³, from its cache, (re)building the cache when needed.
    ``site``: the data's site (default openkbp); each site has its cache (:func:`cache_path_for`),
    and one that records another site is rebuilt.

    ``require_dose``: a patient without ``dose.csv`` is an error (or, with ``skip_incomplete``,
    skipped). ``skip_incomplete``: patients with missing or malformed files are left out and
    listed in ``SplitArrays.skipped`` instead of raising :class:`PatientDataError`.
    ``memory_map``: the volumes are views into the cache file, read and checked as touched
    (:mod:`provided_code.data.mapped`), rather than read into memory.
    """
    split_dir = Path(split_dir)
    folders = discover_patients(split_dir)
    site = load_site(site)
    path = cache_path_for(split_dir, cache_dir, site)
    fingerprint = source_fingerprint(folders)
    try:
        arrays = load_cache(path, fingerprint=fingerprint, skip_incomplete=skip_incomplete, site=site,
                            mapped=memory_map)
        logger.info("%s %d patients of %s from cache %s", "Mapped" if memory_map else "Loaded", len(arrays),
                    split_dir, path)
    except CacheError as error:
        if path.exists():
            logger.warning("Rebuilding cache %s: %s", path, error)
        build_cache(split_dir, path, folders, fingerprint, skip_incomplete, progress, workers, site)
        arrays = load_cache(path, fingerprint=fingerprint, skip_incomplete=skip_incomplete, site=site,
                            mapped=memory_map)

    if require_dose and not arrays.has_dose.all():
        missing = [pid for pid, has in zip(arrays.patient_ids, arrays.has_dose) if not has]
        if not skip_incomplete:
            raise PatientDataError(missing[0], split_dir / missing[0] / "dose.csv",
                                   "file is missing (a dose is required for training)")
        skipped = dict(arrays.skipped)
        skipped.update({pid: "dose.csv is missing" for pid in missing})
        arrays = arrays.select(np.flatnonzero(arrays.has_dose))
        arrays.skipped = skipped
    if arrays.skipped:
        logger.warning(
            "Skipped %d incomplete patient(s) of %s: %s", len(arrays.skipped), split_dir,
            "; ".join(f"{pid} ({why})" for pid, why in arrays.skipped.items()),
        )
    if len(arrays) == 0:
        raise PatientDataError("(all)", split_dir, "no complete patient is left after skipping")
    arrays.folder = split_dir
    return arrays


def exact_dose(dose: np.ndarray, decimals: int) -> np.ndarray:
    """Float64 dose as its CSV gave it: float32 values rounded back to their decimal grid."""
    dose = np.asarray(dose, dtype=np.float64)
    return np.round(dose, decimals) if decimals >= 0 else dose


def _read_or_error(folder: Path, site: Site | None = None) -> Patient | PatientDataError:
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
    site: Site | None = None,
) -> None:
    """Parse every patient folder of ``site`` and write the cache atomically to ``path``: in
    ``workers`` processes (default: one per core from ``POOL_MIN_PATIENTS`` patients, else this one)."""
    site = load_site(site)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.parent.resolve() == split_dir.resolve() or split_dir.resolve() in path.resolve().parents:
        raise ValueError(f"Invalid `cache_dir`. Expected a folder outside the data. Received: {path.parent}")
    if not workers:
        workers = (os.cpu_count() or 1) if len(folders) >= POOL_MIN_PATIENTS else 1
    workers = max(1, min(workers, len(folders)))
    count = len(folders)
    skipped: dict[str, str] = {}
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as h5:
            volumes = {
                name: h5.create_dataset(name, (count, *VOLUME_SHAPE), dtype=dtype,
                                        maxshape=(None, *VOLUME_SHAPE), chunks=(1, *VOLUME_SHAPE))
                for name, dtype in _volume_dtypes(site).items()
            }
            has_dose = np.zeros(count, bool)
            dose_decimals = np.full(count, -1, np.int8)
            voxel_dimensions = np.zeros((count, 3))
            structure_present = np.zeros((count, len(site.names)), bool)
            checksums = np.zeros((count, len(_VOLUMES)), np.uint64)
            patient_ids: list[str] = []
            plans = []  # (prescriptions, gantry_angles) of each kept patient
            with PatientReader(workers, site) as read:
                for result in progress(read(folders), count, f"Caching {split_dir.name}"):
                    if isinstance(result, PatientDataError):
                        if not skip_incomplete:
                            raise result
                        skipped[result.patient_id] = f"{Path(result.path).name}: {result.problem}"
                        continue
                    row = len(patient_ids)
                    patient_ids.append(result.patient_id)
                    volumes["ct"][row] = result.ct
                    volumes["structure_masks"][row] = result.structure_masks
                    volumes["possible_dose_mask"][row] = result.possible_dose_mask
                    # written even when absent (zeros), so that every patient's chunk exists on disk
                    dose = result.dose if result.dose is not None else np.zeros(VOLUME_SHAPE, np.float32)
                    volumes["dose"][row] = dose
                    checksums[row] = [chunk_checksum(np.asarray(volume, dtype))
                                      for volume, dtype in zip((result.ct, result.structure_masks,
                                                                result.possible_dose_mask, dose),
                                                               _volume_dtypes(site).values())]
                    if result.dose is not None:
                        has_dose[row] = True
                        dose_decimals[row] = result.dose_decimals
                    voxel_dimensions[row] = result.voxel_dimensions
                    structure_present[row] = present_structures(result.structure_masks, len(site.names))
                    plans.append(dataclasses.replace(result, ct=None, structure_masks=None, possible_dose_mask=None,
                                                     dose=None))
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
            for name, table in plan_tables(plans, site).items():
                if table is not None:
                    h5.create_dataset(name, data=table)
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

    def __init__(self, workers: int, site: Site | None = None):
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


def _read_chunks(path: Path, reads: list[tuple[np.ndarray, int, np.uint64 | None, str]]) -> None:
    """Fill each array from its byte offset in ``path``, several reads at once, and check each
    against its checksum (None: not checked) while its bytes are still in the processor's cache.

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


def load_cache(path: Path, fingerprint: str | None = None, skip_incomplete: bool | None = None,
               verify: bool = True, site: Site | None = None, mapped: bool = False) -> SplitArrays:
    """Read a cache file into memory. Raises :class:`CacheError` if it is missing, stale, broken or
    of another site than ``site`` (None: any; ``verify``: every chunk against its checksum; off only
    to measure what checking costs). ``mapped``: map the volumes instead
    (:class:`~provided_code.data.mapped.MappedVolumes`): each patient's chunk is read, and checked
    once, when first touched."""
    if not path.is_file():
        raise CacheError(f"no cache file at {path}")
    try:
        with h5py.File(path, "r") as h5:
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
            if site is not None and not built_for.same_as(site):
                raise CacheError(f"{path} was built for site {built_for.name}, this run's site is {site.name}"
                                 + ("" if built_for.name != site.name else " (another version of it)"))
            patient_ids = [p.decode() if isinstance(p, bytes) else p for p in h5["patient_ids"][()]]
            count = len(patient_ids)
            checksums = h5["checksums"][()]
            if checksums.shape != (count, len(_VOLUMES)):
                raise CacheError(f"{path}: checksums do not match {count} patients")
            arrays, reads, layout = {}, [], {}
            for column, (name, dtype) in enumerate(_volume_dtypes(built_for).items()):
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
            small = {name: h5[name][()] for name in _TABLES}
            small.update({name: h5[name][()] if name in h5 else None for name in _PLAN_TABLES})
            skipped = json.loads(attrs["skipped"])
        if mapped:
            from provided_code.data.mapped import map_volumes  # (it builds on this module)

            arrays = map_volumes(path, layout, patient_ids, VOLUME_SHAPE)
        else:
            _read_chunks(path, reads)
    except CacheError:
        raise
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as error:
        raise CacheError(f"{path} is unreadable or truncated ({error})") from error
    if small["voxel_dimensions"].shape != (count, 3) or small["has_dose"].shape != (count,):
        raise CacheError(f"{path}: per-patient tables do not match {count} patients")
    return SplitArrays(patient_ids=patient_ids, skipped=skipped, site=built_for, **arrays, **small)


def _volume_dtypes(site: Site) -> dict[str, np.dtype]:
    """The cache's volumes and their dtypes: the structure bits in the site's width."""
    return {**_VOLUMES, "structure_masks": site.mask_dtype}
