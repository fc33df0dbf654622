"""A split's patients stacked into contiguous arrays, patients first: :class:`SplitArrays`.

What every layer above the CSV reader works on: the cache (:mod:`provided_code.data.cache`) loads
one from its file, the memory-mapped reader (:mod:`provided_code.data.mapped`) maps its volumes,
:meth:`SplitArrays.from_patients` stacks patients read from their folders. The arrays, their
shapes and dtypes are those of the cache's datasets (the table in :mod:`provided_code.data.cache`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from provided_code.constants import VOLUME_SHAPE
from provided_code.data.csv_io import Patient
from provided_code.sites import Site

VOLUMES = {"ct": np.uint16, "structure_masks": np.uint16, "possible_dose_mask": bool, "dose": np.float32}
VOLUME_NAMES = tuple(VOLUMES)  # the per-patient volumes, in the order of the cache's checksum columns
TABLES = ("has_dose", "dose_decimals", "voxel_dimensions", "structure_present")  # small per-patient arrays
PLAN_TABLES = ("prescriptions", "beam_angles")  # per-patient plans: None when no patient has its own file


def volume_dtypes(site: Site) -> dict[str, np.dtype]:
    """The volumes and their dtypes: the structure bits in the site's width."""
    return {**VOLUMES, "structure_masks": site.mask_dtype}


def stacked_nbytes(patients: int, resolution: int = VOLUME_SHAPE[0], *, site: Site) -> int:
    """The bytes ``patients`` patients' volumes of ``site`` take stacked in memory at ``resolution``³."""
    dtypes = volume_dtypes(site).values()
    return patients * sum(np.dtype(dtype).itemsize for dtype in dtypes) * resolution ** 3


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


@dataclasses.dataclass
class SplitArrays:
    """A split's patients stacked into contiguous arrays, patients first (the cache's table)."""

    patient_ids: list[str]
    ct: np.ndarray
    structure_masks: np.ndarray
    possible_dose_mask: np.ndarray
    dose: np.ndarray
    has_dose: np.ndarray
    dose_decimals: np.ndarray
    voxel_dimensions: np.ndarray  # mm, of the 128³ grid whatever the resolution
    structure_present: np.ndarray
    site: Site  # what bit k of structure_masks is
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # patient id -> reason
    prescriptions: np.ndarray | None = None  # (N, len(site.targets)) float32 Gy; None: the site's for all
    beam_angles: np.ndarray | None = None  # (N, slots) float32 degrees, NaN unused; None: the run's for all
    # (both as the files say: NaN rows for patients without the file; see plan_tables)
    folder: Path | None = None  # the split's folder (load_split's), to name a patient's files in messages
    sources: list[dict[str, str]] | None = None  # per patient, {file name: SHA-256} of every file it was read
    #                                              from (csv_io.source_files); None: not known
    vectors: dict = dataclasses.field(default_factory=dict)  # InputSpec -> (N, length) float32: a model's per-patient
    # vector inputs made once for every patient (data.batches.fit_vectors), what take_inputs indexes

    def __len__(self) -> int:
        return len(self.patient_ids)

    @property
    def resolution(self) -> int:
        return self.ct.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in (*VOLUMES, *TABLES, *PLAN_TABLES)
                   if getattr(self, name) is not None)

    @classmethod
    def from_patients(cls, patients: list[Patient], *, site: Site) -> "SplitArrays":
        """Patients of ``site`` read from their folders, stacked (no cache; for a handful of patients)."""
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
            sources=None if any(p.sources is None for p in patients) else [dict(p.sources) for p in patients],
        )

    def select(self, rows: np.ndarray) -> "SplitArrays":
        """The patients at ``rows`` (a copy; of memory-mapped volumes, a mapping of those rows)."""
        rows = np.asarray(rows, dtype=np.int64)
        return dataclasses.replace(
            self,
            patient_ids=[self.patient_ids[i] for i in rows],
            **{name: _take_rows(getattr(self, name), rows) for name in (*VOLUMES, *TABLES)},
            **{name: None if getattr(self, name) is None else getattr(self, name)[rows] for name in PLAN_TABLES},
            vectors={spec: vectors[rows] for spec, vectors in self.vectors.items()},
            skipped=dict(self.skipped),
            sources=None if self.sources is None else [self.sources[i] for i in rows],
        )

    def sources_of(self) -> dict[str, dict[str, str]] | None:
        """``{patient: {file name: SHA-256}}`` of the files each patient was read from (None: not known)."""
        return None if self.sources is None else dict(zip(self.patient_ids, self.sources, strict=True))

    @property
    def memory_mapped(self) -> bool:
        """Whether the volumes are views into the cache file (:mod:`provided_code.data.mapped`)."""
        return hasattr(self.ct, "subset")


def _take_rows(array, rows: np.ndarray):
    """``array[rows]``; a memory-mapped volume stays mapped (no patient's bytes are read)."""
    return array.subset(rows) if hasattr(array, "subset") else array[rows]
