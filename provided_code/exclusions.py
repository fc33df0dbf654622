"""Training patients left out on purpose (``--exclude FILE``): a CSV of ``patient,reason``, one row per
patient, as a physicist writes it after commissioning (an outlier plan, a contour to redo). The
list, the file it came from and the command that asked are kept in the model's ``config.json``.

Pure Python: importing this imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from provided_code.errors import UserError

HEADER = ("patient", "reason")


class ExclusionError(UserError, ValueError):
    """An exclusion list that cannot be used: one line naming the file, the line and the problem."""


def read_exclusions(path: os.PathLike | str) -> tuple[dict, ...]:
    """``({"patient": id, "reason": text}, ...)`` of an exclusion file, in its order. A byte-order
    mark is accepted; every row needs a patient and a reason, each patient once."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        raise ExclusionError(f"{path}: cannot read the exclusion list ({error})") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or tuple(cell.strip() for cell in rows[0]) != HEADER:
        raise ExclusionError(f"{path}: line 1: the header must be {','.join(HEADER)}; found "
                             f"{','.join(rows[0]) if rows else 'an empty file'!r}")
    excluded, seen = [], set()
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise ExclusionError(f"{path}: line {line}: expected a patient and a reason, e.g. pt_12,\"parotid spared "
                                 f"far less than predicted\"; found {','.join(row)!r}")
        patient, reason = row[0].strip(), row[1].strip()
        if patient in seen:
            raise ExclusionError(f"{path}: line {line}: {patient} is listed twice")
        seen.add(patient)
        excluded.append({"patient": patient, "reason": reason})
    return tuple(excluded)


def excluded_patients(excluded) -> set[str]:
    return {entry["patient"] for entry in excluded}


def split_patients(read: Sequence[str], skipped: Mapping[str, str], excluded: Collection[str]) -> list[str]:
    """Every patient of a training split, as its folds deal them: those read (``read``, in their
    order), then those of ``--exclude`` (``excluded``) whose files could not be read (``skipped``:
    the loaded split's patient -> why), sorted. Such a patient is left out of training and scoring
    but was dealt all the same; a patient skipped and not excluded is not one of them."""
    return [*read, *sorted(set(excluded) & set(skipped))]
