"""Reading and writing the OpenKBP sparse-CSV patient format.

A patient folder ``pt_<N>/`` holds ``ct.csv``, ``dose.csv`` (absent where only predicting),
``possible_dose_mask.csv``, ``voxel_dimensions.csv`` and one CSV per contoured structure. Every
volume CSV has the header ``,data``; its first column is a flat C-order index into the 128³
volume and its second the value (empty for masks). Only listed voxels are non-zero.

In memory a patient is a :class:`Patient`: ``ct`` as uint16 clipped to [0, 4095],
``structure_masks`` as one bitfield volume (bit k set where structure ``site.names[k]`` is;
uint16, uint32 for a site of more than 16 structures), ``possible_dose_mask`` as bool, ``dose``
in Gy as float32. The structures are those of the data's site (:mod:`provided_code.sites`); a
patient folder may also hold its own ``prescriptions.csv`` and ``beams.csv``
(:mod:`provided_code.data.patient_plan`). What a patient's figures are computed from is every file
:func:`read_patient` reads: :func:`source_files`, each known by its SHA-256 (``Patient.sources``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from provided_code.infra.atomic import write_text_atomic
from provided_code.infra.checksum import file_checksum
from provided_code.constants import (
    BEAMS_FILE,
    CT_FILE,
    CT_MAX,
    DOSE_FILE,
    NUM_VOXELS,
    PATIENT_FILES,
    POSSIBLE_DOSE_MASK_FILE,
    PRESCRIPTIONS_FILE,
    VOLUME_SHAPE,
    VOXEL_DIMENSIONS_FILE,
)
from provided_code.data import patient_plan
from provided_code.data.errors import PatientDataError  # noqa: F401  (raised here; importers take it from here too)
from provided_code.errors import UserError
from provided_code.sites import Site

logger = logging.getLogger(__name__)

_PATIENT_FOLDER = re.compile(r"^pt_(\d+)$")
_WARNED_SPLITS: set[Path] = set()  # splits whose other folders were named already (once per process)


class SplitError(UserError, ValueError):
    """A dataset split folder is missing or holds no patients."""


@dataclasses.dataclass
class Patient:
    patient_id: str  # folder name, e.g. "pt_12"
    ct: np.ndarray  # (128, 128, 128) uint16, clipped to [0, 4095]
    structure_masks: np.ndarray  # (128, 128, 128) site.mask_dtype, bit k = site.names[k]
    possible_dose_mask: np.ndarray  # (128, 128, 128) bool
    voxel_dimensions: np.ndarray  # (3,) float64, mm
    dose: np.ndarray | None  # (128, 128, 128) float32 Gy, None when the folder has no dose.csv
    dose_decimals: int = -1  # fewest decimals (0..5) that write every dose.csv value exactly; -1: none
    prescriptions: dict[str, float] | None = None  # target -> Gy from prescriptions.csv; None: the site's
    gantry_angles: tuple[float, ...] | None = None  # from beams.csv (arcs sampled); None: the run's
    sources: dict[str, str] | None = None  # {file name: SHA-256} of every file read (source_files); None: not known


def patient_number(patient_id: str) -> int:
    """The number of a ``pt_<N>`` name (raises ValueError for anything else)."""
    match = _PATIENT_FOLDER.match(patient_id)
    if match is None:
        raise ValueError(
            f"Invalid `patient_id`. Expected a name of the form pt_<N>. Received: patient_id={patient_id!r}"
        )
    return int(match.group(1))


def discover_patients(split_dir: os.PathLike | str) -> list[Path]:
    """The ``pt_<N>`` folders of a split, ordered by patient number (pt_2 before pt_10). Other
    folders (``pt_x``, ``Pt_6``; hidden ones aside) are left out with a warning naming them, once
    per split and process."""
    split_dir = Path(split_dir)
    if not split_dir.is_dir():
        raise SplitError(f"Split folder {split_dir} does not exist or is not a folder.")
    folders, others = [], []
    for path in split_dir.iterdir():
        if path.is_dir():
            if _PATIENT_FOLDER.match(path.name):
                folders.append(path)
            elif not path.name.startswith("."):
                others.append(path.name)
    if others and split_dir.resolve() not in _WARNED_SPLITS:
        _WARNED_SPLITS.add(split_dir.resolve())
        logger.warning("%s: skipped %d folder(s) not named pt_<N> (a patient folder's name is pt_ and its "
                       "number): %s", split_dir, len(others), ", ".join(sorted(others)))
    if not folders:
        raise SplitError(f"Split folder {split_dir} holds no pt_<N> patient folders.")
    return sorted(folders, key=lambda p: patient_number(p.name))


def read_sparse_csv(path: Path, patient_id: str, with_values: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Flat indices (int64) and, if ``with_values``, values (float64) of one sparse volume CSV."""
    if not path.is_file():
        raise PatientDataError(patient_id, path, "file is missing")
    try:
        frame = pd.read_csv(path, header=0)
    except pd.errors.EmptyDataError:
        raise PatientDataError(patient_id, path, "file is empty; expected the header ',data'") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise PatientDataError(patient_id, path, f"not a readable CSV ({error})") from None
    if list(frame.columns) != ["Unnamed: 0", "data"]:
        raise PatientDataError(
            patient_id, path, f"header is {','.join(map(str, frame.columns))!r}; expected ',data'"
        )
    if not frame.index.equals(pd.RangeIndex(len(frame))):  # more fields than the header: pandas made row labels
        raise PatientDataError(patient_id, path, _wrong_field_count(path))
    indices = _numeric_column(frame.iloc[:, 0], patient_id, path, "index")
    whole = indices == np.floor(indices)
    if not np.all(whole):
        line = int(np.flatnonzero(~whole)[0]) + 2
        raise PatientDataError(patient_id, path, f"index on line {line} is not a whole number")
    indices = indices.astype(np.int64)
    outside = (indices < 0) | (indices >= NUM_VOXELS)
    if np.any(outside):
        row = int(np.flatnonzero(outside)[0])
        raise PatientDataError(
            patient_id, path,
            f"index {indices[row]} on line {row + 2} is outside 0..{NUM_VOXELS - 1}",
        )
    if indices.size > 1 and not np.all(indices[1:] > indices[:-1]):  # the challenge's files are sorted: one pass
        order = np.argsort(indices, kind="stable")
        repeated = np.flatnonzero(indices[order][1:] == indices[order][:-1])
        if repeated.size:
            first, second = sorted(order[repeated[0]:repeated[0] + 2])
            raise PatientDataError(patient_id, path, f"index {indices[first]} is listed twice "
                                                     f"(lines {first + 2} and {second + 2})")
    values = _numeric_column(frame.iloc[:, 1], patient_id, path, "value") if with_values else None
    return indices, values


def as_volume(indices: np.ndarray, values: np.ndarray | None, dtype) -> np.ndarray:
    """A flat 128³ volume of ``dtype`` from a sparse CSV's indices and values (None, a mask's:
    true at the indices), zero elsewhere."""
    volume = np.zeros(NUM_VOXELS, dtype)
    volume[indices] = True if values is None else values
    return volume


def read_dose_csv(path: os.PathLike | str, patient_id: str = "", dtype=np.float32) -> np.ndarray:
    """A 128³ dose (Gy) as ``dtype`` from an OpenKBP sparse CSV (a prediction or a dose.csv)."""
    path = Path(path)
    indices, values = read_sparse_csv(path, patient_id or path.stem, with_values=True)
    return as_volume(indices, values, dtype).reshape(VOLUME_SHAPE)


def _wrong_field_count(path: Path) -> str:
    """The first line of ``path`` that does not have the header's two fields, as a problem."""
    with open(path, encoding="utf-8-sig", errors="replace") as handle:
        next(handle, None)
        for number, line in enumerate(handle, start=2):
            fields = line.rstrip("\r\n").count(",") + 1
            if fields != 2:
                shown = line.rstrip("\r\n")
                shown = shown if len(shown) <= 40 else shown[:40] + "..."
                return (f"line {number} has {fields} comma-separated fields ({shown!r}); expected 2 "
                        f"(index,value), as the header ',data' says")
    return "a line has more fields than the header ',data' (index,value)"


def _numeric_column(column: pd.Series, patient_id: str, path: Path, what: str) -> np.ndarray:
    """A column as float64; names the first line that is not a finite number."""
    if pd.api.types.is_numeric_dtype(column.dtype):
        numbers = column.to_numpy(dtype=np.float64)
    else:  # pandas found text: coerce to locate the offending line
        numbers = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(numbers)
    if np.any(bad):
        row = int(np.flatnonzero(bad)[0])
        raise PatientDataError(
            patient_id, path,
            f"{what} {_shown(column.iloc[row])} on line {row + 2} is not a finite number",
        )
    return numbers


def _shown(value) -> str:
    """A cell as the user wrote it: ``'abc'``, ``inf``, ``nan or empty`` (never ``np.float64(nan)``)."""
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, float) and np.isnan(value):
        return "nan or empty"
    return str(value)


def read_voxel_dimensions(path: Path, patient_id: str) -> np.ndarray:
    """The three voxel spacings in mm, one per line, no header."""
    if not path.is_file():
        raise PatientDataError(patient_id, path, "file is missing")
    try:
        values = np.loadtxt(path, dtype=np.float64, ndmin=1, encoding="utf-8-sig")  # a byte-order mark is fine
    except ValueError as error:
        raise PatientDataError(patient_id, path, f"expected three positive numbers ({error})") from None
    if values.shape != (3,) or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise PatientDataError(
            patient_id, path, f"expected three positive numbers, one per line; found {values.tolist()}"
        )
    return values


def read_patient(folder: os.PathLike | str, require_dose: bool = True, *, site: Site) -> Patient:
    """Read one patient folder of ``site``. Raises :class:`PatientDataError` for missing or
    malformed files, and for a structure file the site does not have (a folder of another site)."""
    folder = Path(folder)
    patient_id = folder.name
    _check_files_belong(folder, site)

    ct_indices, ct_values = read_sparse_csv(folder / CT_FILE, patient_id, with_values=True)
    ct = as_volume(ct_indices, np.clip(np.rint(ct_values), 0, CT_MAX), np.uint16)
    possible_dose_mask = as_volume(*read_sparse_csv(folder / POSSIBLE_DOSE_MASK_FILE, patient_id, with_values=False),
                                   bool)

    dtype = site.mask_dtype
    structure_masks = np.zeros(NUM_VOXELS, dtype)
    for bit, name in enumerate(site.names):
        path = folder / f"{name}.csv"
        if path.is_file():  # a structure that was not contoured has no file
            indices, _ = read_sparse_csv(path, patient_id, with_values=False)
            structure_masks[indices] |= dtype.type(1 << bit)

    voxel_dimensions = read_voxel_dimensions(folder / VOXEL_DIMENSIONS_FILE, patient_id)

    dose, dose_decimals = None, -1
    dose_path = folder / DOSE_FILE
    if dose_path.is_file() or require_dose:
        dose_indices, dose_values = read_sparse_csv(dose_path, patient_id, with_values=True)
        _check_dose(patient_id, dose_path, dose_indices, dose_values, possible_dose_mask)
        dose = as_volume(dose_indices, dose_values, np.float32)
        dose_decimals = decimals_of(dose_values)

    prescriptions, gantry_angles = patient_plan.read_plan(folder, site)
    sources = {path.name: file_checksum(path) for path in source_files(folder, site)}  # the files just read
    return Patient(
        patient_id=patient_id,
        ct=ct.reshape(VOLUME_SHAPE),
        structure_masks=structure_masks.reshape(VOLUME_SHAPE),
        possible_dose_mask=possible_dose_mask.reshape(VOLUME_SHAPE),
        voxel_dimensions=voxel_dimensions,
        dose=None if dose is None else dose.reshape(VOLUME_SHAPE),
        dose_decimals=dose_decimals,
        prescriptions=prescriptions,
        gantry_angles=gantry_angles,
        sources=sources,
    )


def source_files(folder: os.PathLike | str, site: Site) -> list[Path]:
    """The files of a patient folder that :func:`read_patient` reads, those present, sorted by name:
    the CT, the possible-dose mask, each contoured structure of ``site``, the voxel dimensions, the
    dose, and the patient's own plan files (prescriptions, beams): every file its figures (DVH
    values, anatomy features, the model's inputs) are computed from."""
    folder = Path(folder)
    names = (CT_FILE, POSSIBLE_DOSE_MASK_FILE, *site.structure_files(), VOXEL_DIMENSIONS_FILE, DOSE_FILE,
             PRESCRIPTIONS_FILE, BEAMS_FILE)
    return sorted((folder / name for name in dict.fromkeys(names) if (folder / name).is_file()),
                  key=lambda path: path.name)


def _check_files_belong(folder: Path, site: Site) -> None:
    """Every CSV of the folder is a file of the format, of the site's structures or of the
    patient's plan: a structure file the site does not know means data of another site, which
    would otherwise train without it."""
    known = {*PATIENT_FILES, *site.structure_files()}
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if entry.name.endswith(".csv"))
    except OSError:
        return  # a missing folder is named by the first file read
    foreign = [name for name in names if name not in known]
    if foreign:
        raise PatientDataError(folder.name, folder / foreign[0],
                               f"not a structure of site {site.name} ({', '.join(site.names)}): is this data of "
                               f"another site? ({len(foreign)} such file(s); a model reads data of its own site, and a "
                               f"new training run of another takes --site)")


def _check_dose(patient_id: str, path: Path, indices: np.ndarray, values: np.ndarray,
                possible_dose_mask: np.ndarray) -> None:
    """A reference dose lists values, none negative, none non-zero outside the possible-dose mask
    (the challenge's scores assume it): else a :class:`PatientDataError`. A header-only file would
    be a zero dose that trains and scores silently."""
    if indices.size == 0:
        raise PatientDataError(patient_id, path, "lists no voxel (a header only), which would be a zero "
                                                 "dose everywhere")
    negative = np.flatnonzero(values < 0)
    if negative.size:
        row = int(negative[0])
        raise PatientDataError(patient_id, path, f"dose {_shown(values[row])} on line {row + 2} is negative "
                                                 f"({negative.size} negative value(s))")
    outside = np.flatnonzero((values != 0) & ~possible_dose_mask[indices])
    if outside.size:
        row = int(outside[0])
        raise PatientDataError(patient_id, path, f"the dose is non-zero in {outside.size} voxel(s) outside the "
                                                 f"possible-dose mask ({POSSIBLE_DOSE_MASK_FILE}), the first "
                                                 f"index {indices[row]} on line {row + 2}")


def decimals_of(values: np.ndarray, most: int = 5) -> int:
    """The fewest decimals (0..most) that write every value exactly, or -1."""
    for decimals in range(most + 1):
        if np.array_equal(np.round(values, decimals), values):
            return decimals
    return -1


def exact_dose(dose: np.ndarray, decimals: int) -> np.ndarray:
    """Float64 dose as its CSV gave it: float32 values rounded back to their decimal grid
    (``decimals``: :func:`decimals_of` the CSV's values; -1: as they are)."""
    dose = np.asarray(dose, dtype=np.float64)
    return np.round(dose, decimals) if decimals >= 0 else dose


def write_dose_csv(path: os.PathLike | str, dose: np.ndarray,
                   possible_dose_mask: np.ndarray | None = None) -> np.ndarray:
    """Write a 128³ dose (Gy) as a sparse OpenKBP CSV, atomically; return the listed values' text
    (a numpy string array, in the file's order: what a reader parses).

    With ``possible_dose_mask`` every voxel of the mask is listed (zeros included), as the
    challenge's own ``dose.csv`` files do; without it, every non-zero voxel. Values are written
    as the shortest decimal that reads back to the same float32.
    """
    path = Path(path)
    dose = np.asarray(dose)
    if dose.shape != VOLUME_SHAPE:
        raise ValueError(f"Invalid `dose`. Expected shape {VOLUME_SHAPE}. Received: dose.shape={dose.shape}")
    flat = dose.reshape(-1).astype(np.float32)
    if not np.all(np.isfinite(flat)):
        raise ValueError(f"Invalid `dose` for {path}. Expected finite values. Received: NaN or infinity")
    if possible_dose_mask is None:
        indices = np.flatnonzero(flat)
    else:
        indices = np.flatnonzero(np.asarray(possible_dose_mask).reshape(-1))
    return write_sparse_csv(path, indices, flat[indices])


def write_sparse_csv(path: os.PathLike | str, indices: np.ndarray, values: np.ndarray | None) -> np.ndarray | None:
    """Write flat indices and values (None for a mask) in the OpenKBP sparse format, atomically;
    return the values' text as written for floating-point values (a numpy string array: what a
    reader parses); None for a mask or integer values (their text is their value).

    Float values are written as the shortest decimal that reads back to the same number in their
    dtype (float32 7.675 is written ``7.675``), integers as they are. A mask's or integer volume's
    lines are composed as columns of bytes, not as one Python string a voxel (a dense 128³ CT has
    two million lines); float values' text (numpy's shortest decimals) is most of their cost, and
    their lines are joined as strings (``python scripts/bench_data.py --part csv`` times both ways).
    """
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    if values is None:
        parts = [_integer_text(indices), b",\n"]
    else:
        values = np.asarray(values).reshape(-1)
        if len(values) != len(indices):
            raise ValueError(f"Invalid `values` for {path}. Expected one value an index ({len(indices)}). "
                             f"Received: {len(values)} values")
        if not (np.issubdtype(values.dtype, np.integer) and np.can_cast(values.dtype, np.int64)):
            value_text = values.astype(str)  # numpy's shortest round-trip decimal of the dtype
            lines = [f"{i},{v}\n" for i, v in zip(indices.tolist(), value_text.tolist(), strict=True)]
            write_text_atomic(Path(path), ",data\n" + "".join(lines))
            return value_text
        parts = [_integer_text(indices), b",", _integer_text(values.astype(np.int64)), b"\n"]
    # every line's bytes side by side, each number padded to its longest, and the bytes each line keeps
    widths = [len(part) if isinstance(part, bytes) else part[0].shape[1] for part in parts]
    lines = np.empty((len(indices), sum(widths)), np.uint8)
    kept = np.ones(lines.shape, bool)
    column = 0
    for part, width in zip(parts, widths):
        if isinstance(part, bytes):
            lines[:, column:column + width] = np.frombuffer(part, np.uint8)
        else:
            lines[:, column:column + width], kept[:, column:column + width] = part
        column += width
    write_text_atomic(Path(path), ",data\n" + lines[kept].tobytes().decode("ascii"))
    return None


def _integer_text(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Integers (int64) as rows of right-aligned decimal digits behind a column for the minus sign
    (uint8 ASCII), and the bytes each row keeps (no padding; 0 is "0")."""
    magnitude = np.abs(values)
    largest = int(magnitude.max()) if len(values) else 0
    width = len(str(largest))
    digits = np.empty((len(values), width + 1), np.uint8)
    digits[:, 0] = ord("-")
    rest = magnitude.astype(np.uint32 if largest < 2 ** 32 else np.uint64)  # divides faster than int64
    for column in range(width, 0, -1):
        rest, digits[:, column] = np.divmod(rest, rest.dtype.type(10))
    digits[:, 1:] += ord("0")
    lengths = np.maximum(1, np.searchsorted(10 ** np.arange(width, dtype=np.int64), magnitude, side="right"))
    keep = np.arange(width + 1) > width - lengths[:, None]
    keep[:, 0] = values < 0
    return digits, keep
