"""Who is who in ``openkbp-dicom import-cohort``: pseudonyms, splits, and the archive's paths.

- Pseudonyms: ``pt_<N>``, numbered in the order of a hash of the PatientID, after those an earlier
  run gave. The identity map (``pseudonym,patient_id``, by default ``DATA_DIR/identity-map.csv``,
  readable by its owner only from its creation) is the only place that links them
  (:class:`IdentityMap`).
- Splits (:func:`assign_splits`): a patient is in validation when a hash of its PatientID and the
  seed falls below the fraction (``validation`` < 1), or, for a count, among the new patients of
  lowest hash until the count is reached; a patient keeps the split an earlier run gave it.
- Sources (:class:`Sources`): the manifest holds no path in the archive (PACS exports name folders
  after patients); it numbers them (``#<N>``), and the sources file beside the identity map
  (``identity-map.sources.csv``, as private) says which path each number is.
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path

from provided_code.dicom.errors import CohortError
from provided_code.dicom.ledger import csv_text, read_csv
from provided_code.infra.atomic import write_text_atomic

IDENTITY_FILE = "identity-map.csv"
SOURCES_SUFFIX = ".sources.csv"  # the archive paths the manifest numbers: beside the identity map, named after it


def unit_hash(*parts: str) -> float:
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return int(digest[:15], 16) / 16**15


def parse_validation(text: str | float | int) -> float | int:
    """``--validation``: a fraction in [0, 1) or a count of patients (an integer ≥ 1)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(text, str) and text.strip().isdigit() and int(text) >= 1:
        return int(text)
    if isinstance(text, int) and text >= 1:
        return text
    if not 0 <= value < 1:
        raise CohortError(f"Invalid `validation`. Expected a fraction in [0, 1) or a count of patients. "
                          f"Received: validation={text!r}")
    return value


def pseudonym_number(pseudonym: str) -> int:
    """``pt_12`` -> 12 (0 for anything else)."""
    return int(pseudonym[3:]) if pseudonym.startswith("pt_") and pseudonym[3:].isdigit() else 0


def source_number(source: str) -> int:
    """``#12`` -> 12 (0 for anything else)."""
    return int(source[1:]) if source[:1] == "#" and source[1:].isdigit() else 0


class IdentityMap:
    """The identity map at ``path``: ``pseudonyms`` maps each PatientID to its pseudonym;
    ``cohort`` is the identifier of the data folder it belongs to (its manifest holds the same;
    '' in a map written before there was one: ``pseudonym,patient_id`` without the column)."""

    FIELDS = ("pseudonym", "patient_id", "cohort")

    def __init__(self, path: Path):
        self.path = path
        rows = read_csv(path)
        if rows and set(rows[0]) not in (set(self.FIELDS), set(self.FIELDS[:2])):
            raise CohortError(f"{path}: not an identity map (header {','.join(self.FIELDS)})")
        _refuse_pseudonyms_given_twice(path, rows)
        self.pseudonyms = {row["patient_id"]: row["pseudonym"] for row in rows}
        self.lines = {row["patient_id"]: line for line, row in enumerate(rows, start=2)}  # the file's, header 1
        self.cohort = next((row["cohort"] for row in rows if row.get("cohort")), "")
        self._written_cohort = self.cohort

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def assign(self, patient_ids: list[str]) -> None:
        """Pseudonyms for new patients (after the highest given), written before anything is imported
        (with the cohort's identifier, :attr:`cohort`, a new one if it has none). An empty PatientID
        is no patient (objects without one, refused by the linking): it gets no pseudonym and no row."""
        new = sorted((p for p in patient_ids if p and p not in self.pseudonyms),
                     key=lambda p: (unit_hash("pseudonym", p), p))
        self.cohort = self.cohort or uuid.uuid4().hex
        if not new and self.cohort == self._written_cohort:
            return
        number = max((pseudonym_number(p) for p in self.pseudonyms.values()), default=0)
        for patient_id in new:
            number += 1
            self.pseudonyms[patient_id] = f"pt_{number}"
        rows = sorted(({"pseudonym": p, "patient_id": i, "cohort": self.cohort} for i, p in self.pseudonyms.items()),
                      key=lambda r: pseudonym_number(r["pseudonym"]))
        # the map re-identifies the cohort: its owner's only, from the temporary file's creation on
        write_text_atomic(self.path, csv_text(self.FIELDS, rows), mode=0o600)
        self._written_cohort = self.cohort

    def label(self, patient_id: str) -> str:
        """How the console and the manifest name a patient: its pseudonym (``(no PatientID)`` for the
        objects without one, which have none)."""
        return self.pseudonyms.get(patient_id) or "(no PatientID)"

    def check_belongs_to(self, out: Path, manifest_rows: list[dict[str, str]]) -> None:
        """Refuse, in one line, a map that is not the one of the data folder ``out`` whose manifest
        has ``manifest_rows``: another cohort's identifier, or (a map or manifest from before
        identifiers) a pseudonym of the manifest the map does not have. A map of this folder
        without an identifier takes the manifest's."""
        cohort = next((row["cohort"] for row in manifest_rows if row.get("cohort")), "")
        where = f"{out / 'manifest.csv'}"
        if cohort and cohort != self.cohort:
            theirs = f"of cohort {self.cohort}" if self.cohort else "without a cohort"
            raise CohortError(f"Invalid `identity_map`. Expected the map of {out} (cohort {cohort}, {where}). "
                              f"Received: identity_map={str(self.path)!r}, {theirs}")
        if not self.cohort:
            unknown = sorted({row["pseudonym"] for row in manifest_rows if row.get("pseudonym")}
                             - set(self.pseudonyms.values()), key=pseudonym_number)
            if unknown:
                raise CohortError(f"Invalid `identity_map`. Expected the map of {out}, which has every pseudonym of "
                                  f"{where}. Received: identity_map={str(self.path)!r}, without {', '.join(unknown[:3])}"
                                  + (" ..." if len(unknown) > 3 else ""))
            self.cohort = cohort


def _refuse_pseudonyms_given_twice(path: Path, rows: list[dict[str, str]]) -> None:
    """A :class:`CohortError` naming the map's lines (not the PatientIDs) of each pseudonym ``rows``
    (the map at ``path``, header line 1) give to more than one patient: imported, they would be
    written into one folder (a hand edit; --reassign-pseudonyms does not allow it either)."""
    lines: dict[str, list[int]] = {}
    for line, row in enumerate(rows, start=2):
        if row.get("pseudonym"):
            lines.setdefault(row["pseudonym"], []).append(line)
    twice = [(pseudonym, found) for pseudonym, found in lines.items() if len(found) > 1]
    if twice:
        counts = {2: "two", 3: "three"}
        raise CohortError(f"{path}, " + "; ".join(
            f"lines {', '.join(map(str, found[:-1]))} and {found[-1]}: pseudonym {pseudonym} given to "
            f"{counts.get(len(found), len(found))} patients" for pseudonym, found in twice)
            + " (one pseudonym is one patient's folder: give each patient a pseudonym of its own)")


def moved_pseudonyms(identity: IdentityMap, earlier: dict[str, str], owners: dict[str, str]) -> dict[str, str]:
    """The pseudonyms ``identity`` gives to another patient than the one they were given to, each
    (in their order) -> one phrase naming the map's lines (not the PatientIDs): ``earlier`` maps the UIDs of the
    objects a data folder's manifest lists under each pseudonym to it
    (:meth:`~provided_code.dicom.ledger.Ledger.pseudonym_of_object`), ``owners`` the same UIDs
    in the archive now to their PatientID (:meth:`~provided_code.dicom.archive.ArchiveIndex.owners`).
    An object gone from the archive, or now without a PatientID, says nothing."""
    holders: dict[str, tuple[str, str | None]] = {}  # pseudonym -> (PatientID now holding its objects, its pseudonym)
    for uid, pseudonym in earlier.items():
        patient_id = owners.get(uid)
        if patient_id and identity.pseudonyms.get(patient_id) != pseudonym:
            holders.setdefault(pseudonym, (patient_id, identity.pseudonyms.get(patient_id)))
    line_of = {pseudonym: identity.lines[patient_id] for patient_id, pseudonym in identity.pseudonyms.items()
               if patient_id in identity.lines}
    moved = {}
    for pseudonym in sorted(holders, key=pseudonym_number):
        patient_id, now = holders[pseudonym]
        row = f"line {line_of[pseudonym]}" if pseudonym in line_of else "no line"
        held = (f"on line {identity.lines[patient_id]}, which gives it {now}" if now else
                "under a PatientID the map does not have (it would get a new pseudonym)")
        moved[pseudonym] = f"{pseudonym} ({row}) was imported from the patient now {held}"
    return moved


def assign_splits(splits: dict[str, str], pseudonyms: dict[str, str], patient_ids: list[str],
                  validation: float | int, seed: int) -> None:
    """Give each of ``patient_ids`` whose pseudonym has no split in ``splits`` (pseudonym -> split)
    one (see the module docstring)."""
    new = [p for p in patient_ids if pseudonyms[p] not in splits]
    if isinstance(validation, int):
        have = sum(split == "validation" for split in splits.values())
        ranked = sorted(new, key=lambda p: (unit_hash(str(seed), p), p))
        chosen = set(ranked[:max(0, validation - have)])
        for patient_id in new:
            splits[pseudonyms[patient_id]] = "validation" if patient_id in chosen else "train"
    else:
        for patient_id in new:
            low = unit_hash(str(seed), patient_id) < validation
            splits[pseudonyms[patient_id]] = "validation" if low else "train"


class Sources:
    """The archive paths the manifest refers to, by number (``#<N>``): PACS exports name folders
    after their patients, so the paths are kept apart from the manifest, beside the identity map
    and as private (``source,path``, the path relative to the archive, a folder's ending in ``/``).
    A path keeps its number on every later run."""

    def __init__(self, path: Path, archive: Path):
        self.path, self.archive = path, archive
        rows = read_csv(path, ("source", "path"), "a sources file of an import")
        self.numbers = {row["path"]: row["source"] for row in rows}
        self.next = 1 + max(map(source_number, self.numbers.values()), default=0)

    @classmethod
    def beside(cls, identity_path: Path, archive: Path) -> "Sources":
        """The sources file of the identity map at ``identity_path``."""
        return cls(identity_path.with_suffix(SOURCES_SUFFIX), archive)

    def ref(self, path: Path, folder: bool = False) -> str:
        try:
            key = Path(path).relative_to(self.archive).as_posix()
        except ValueError:
            key = str(path)
        key += "/" if folder else ""
        if key not in self.numbers:
            self.numbers[key] = f"#{self.next}"
            self.next += 1
        return self.numbers[key]

    def scrub(self, text: str, paths) -> str:
        """``text`` with each of ``paths`` (absolute, relative to the archive, or its file name when
        that holds a letter and a digit, ``.``, ``_``, ``^``, ``-`` or a space: not a mere word, as
        ``DICOMDIR`` is) and the folders between it and the archive replaced by its number; what is
        left of a path in the archive by ``<archive>``."""
        spellings: dict[str, tuple[Path, bool]] = {}  # as written in text -> (path, is a folder)

        def add(spelling: str, path: Path, folder: bool) -> None:
            if os.sep in spelling or "/" in spelling or (re.search(r"[^\W\d_]", spelling) and
                                                         re.search(r"[\d._^ -]", spelling)):  # not a mere word
                spellings.setdefault(spelling, (path, folder))

        for path in (Path(p) for p in paths if p is not None):
            try:
                relative = path.relative_to(self.archive)
            except ValueError:
                continue
            for spelling in (str(path), str(relative), relative.as_posix(), path.name):
                add(spelling, path, False)
            for parent in list(relative.parents)[:-1]:  # the folders between it and the archive
                for spelling in (str(self.archive / parent), str(parent), parent.as_posix()):
                    add(spelling, self.archive / parent, True)
        if spellings:
            alternatives = "|".join(re.escape(t) for t in sorted(spellings, key=len, reverse=True))
            pattern = re.compile(rf"(?<![\w/\\.^-])(?:{alternatives})(?![\w\\^-]|\.\w)")
            text = pattern.sub(lambda match: self.ref(*spellings[match.group(0)]), text)
        return re.sub(re.escape(str(self.archive)) + r"[^\s:;,()'\"]*", "<archive>", text)

    def write(self) -> None:
        rows = sorted(({"source": n, "path": p} for p, n in self.numbers.items()),
                      key=lambda row: source_number(row["source"]))
        write_text_atomic(self.path, csv_text(("source", "path"), rows), mode=0o600)
