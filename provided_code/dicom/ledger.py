"""What ``openkbp-dicom import-cohort`` keeps in a data folder about its imports: the manifest
(``manifest.csv``, one row per patient and plan, series, object and skipped file), the journal of
a run under way (``.import-cohort.journal``: one line per patient's outcome, so that a killed run
resumes), and the earlier imports taken out of the training set (``withdrawn/``).

:class:`Ledger` reads what earlier runs left: each patient's split, which patients are imported
and with which fingerprint; it records each outcome in the journal and moves an earlier import
out of its split. The CSV files of an import are read and written here (:func:`read_csv`,
:func:`csv_text`), the pseudonyms' too (:mod:`provided_code.dicom.pseudonyms`).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import os
import time
from pathlib import Path

from provided_code.data_folder import split_folder_name
from provided_code.dicom.errors import CohortError
from provided_code.infra.atomic import fsync_folder, write_text_atomic

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.csv"
JOURNAL_FILE = ".import-cohort.journal"
WITHDRAWN_DIR = "withdrawn"  # earlier imports of patients that now fail or have no plan chosen, moved out of the splits
SPLITS = {split: split_folder_name(split) for split in ("train", "validation")}  # the splits an import fills
MANIFEST_FIELDS = ("pseudonym", "status", "reason", "kind", "split", "plan_uid", "plan_label", "plan_date",
                   "approval", "dose_summation", "dose_uids", "structure_set_uid", "ct_series_uid",
                   "frame_of_reference_uid", "prescriptions_gy", "missing_targets", "beams", "modality", "uid", "source",
                   "fingerprint", "cohort")  # cohort: the data folder's identifier, which its identity map holds too
OBJECT_FIELDS = ("uid", "plan_uid", "structure_set_uid", "ct_series_uid", "dose_uids")  # a row's archive objects


@dataclasses.dataclass(frozen=True)
class EarlierImport:
    """A patient's import that an earlier run (or this one, before a kill) made."""

    fingerprint: str
    missing_targets: tuple[str, ...] = ()  # the site's targets it lacks (their masks empty)
    warnings: str = ""  # what its manifest row's reason says after "chosen"

    @classmethod
    def of_row(cls, row: dict[str, str]) -> "EarlierImport":
        reason = row.get("reason") or ""
        warnings = reason[len("chosen; "):] if reason.startswith("chosen; ") else ""
        return cls(row.get("fingerprint") or "", tuple((row.get("missing_targets") or "").split()), warnings)


def read_csv(path: Path, columns: tuple[str, ...] | None = None, what: str = "") -> list[dict[str, str]]:
    """The rows of ``path`` ([] when absent), read as UTF-8 (a byte-order mark before the header, as a
    spreadsheet's "CSV UTF-8" writes, is no part of it); other bytes, a :class:`CohortError` naming
    the file, the line and the byte (a map edited by hand in another encoding). With ``columns``, a
    :class:`CohortError` naming the file as not ``what`` unless its header is those columns."""
    if not path.is_file():
        return []
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        start = error.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)  # the codec counts after the mark
        line = data.count(b"\n", 0, start) + 1
        raise CohortError(f"{path}, line {line}: not UTF-8 text (byte 0x{data[start]:02X} at offset {start}); save "
                          f"the file as UTF-8 (a spreadsheet's \"CSV UTF-8\")") from None
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    if columns is not None and rows and set(rows[0]) != set(columns):
        raise CohortError(f"{path}: not {what} (header {','.join(columns)})")
    return rows


def csv_text(fields, rows) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class Ledger:
    """What earlier runs left in ``out``: the manifest's rows, each patient's split, the imports and
    what each was (:class:`EarlierImport`; the journal of a killed run over the manifest), and the earlier imports
    moved to ``withdrawn/`` by this run."""

    def __init__(self, out: Path):
        self.out = out
        self.rows = read_csv(out / MANIFEST_FILE)
        self.splits = {row["pseudonym"]: row["split"] for row in self.rows if row.get("split")}
        self.imports = {row["pseudonym"]: EarlierImport.of_row(row) for row in self.rows
                        if row.get("kind") == "plan" and row.get("status") == "imported"}
        self.withdrawn: dict[str, str] = {}  # pseudonym -> where its earlier import went, this run
        for entry in self._journal():
            self.splits[entry["pseudonym"]] = entry["split"]
            if entry.get("withdrawn"):
                self.withdrawn[entry["pseudonym"]] = entry["withdrawn"]
            if entry["status"] == "imported":
                self.imports[entry["pseudonym"]] = EarlierImport(entry["fingerprint"],
                                                                 tuple(entry.get("missing_targets", ())),
                                                                 entry.get("warnings", ""))
            else:
                self.imports.pop(entry["pseudonym"], None)
        for split, folder in SPLITS.items():  # folders without a record (a run killed before its journal line)
            for path in (out / folder).glob("pt_*"):
                self.splits.setdefault(path.name, split)

    def pseudonym_of_object(self) -> dict[str, str]:
        """Which archive patient each pseudonym came from: the UID of every object and series of the
        plan imported under it (its ``imported`` plan row's ``OBJECT_FIELDS``) -> that pseudonym. A
        pseudonym never imported (its plans refused or set aside) came from no patient's folder: its
        objects may move to new PatientIDs (an ID shared by two patients, exported again with one
        each). A UID named under two pseudonyms tells nothing and is left out."""
        found: dict[str, set[str]] = {}
        for row in self.rows:
            if not row.get("pseudonym") or row.get("kind") != "plan" or row.get("status") != "imported":
                continue
            for field in OBJECT_FIELDS:
                for uid in (row.get(field) or "").split():
                    found.setdefault(uid, set()).add(row["pseudonym"])
        return {uid: next(iter(pseudonyms)) for uid, pseudonyms in found.items() if len(pseudonyms) == 1}

    @property
    def has_manifest(self) -> bool:
        return (self.out / MANIFEST_FILE).is_file()

    def _journal(self) -> list[dict]:
        path = self.out / JOURNAL_FILE
        if not path.is_file():
            return []
        entries = []
        for line in path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut off by a kill: the entries before it hold
        return entries

    def withdraw(self, pseudonym: str) -> None:
        """Move the earlier import of a patient that now fails or has no plan chosen out of its split,
        whole, to ``withdrawn/<pseudonym>-<time>`` (never deleted): a training run takes only the
        patients the manifest says are imported."""
        for split, name in SPLITS.items():
            folder = self.out / name / pseudonym
            if not folder.is_dir():
                continue
            stamp = time.strftime("%Y%m%d-%H%M%S")
            target, k = self.out / WITHDRAWN_DIR / f"{pseudonym}-{stamp}", 1
            while target.exists():
                k += 1
                target = self.out / WITHDRAWN_DIR / f"{pseudonym}-{stamp}-{k}"
            target.parent.mkdir(exist_ok=True)
            os.replace(folder, target)
            fsync_folder(folder.parent)
            fsync_folder(target.parent)
            where = f"{name}/{pseudonym} moved to {target.relative_to(self.out).as_posix()}"
            self.withdrawn[pseudonym] = where
            self.imports.pop(pseudonym, None)
            self.record({"pseudonym": pseudonym, "split": split, "status": "withdrawn", "fingerprint": "",
                         "withdrawn": where})
            logger.warning("%s: its earlier import is taken out of the training set (%s)", pseudonym, where)

    def record(self, entry: dict) -> None:
        """Append one patient's outcome to the journal, durably, before the next patient."""
        with open(self.out / JOURNAL_FILE, "a") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def finish(self, manifest_text: str) -> None:
        """Write the manifest of this run and end its journal."""
        write_text_atomic(self.out / MANIFEST_FILE, manifest_text)
        (self.out / JOURNAL_FILE).unlink(missing_ok=True)
