"""``openkbp-dicom import-cohort``: a clinic's DICOM archive to a training set.

The archive is scanned and linked (:mod:`provided_code.dicom.archive`), one plan chosen per
patient, and each chosen patient imported for the site as ``openkbp-dicom import`` imports one
(:func:`~provided_code.dicom.importer.import_patient`), with the plan's ``prescriptions.csv`` and
``beams.csv`` (:mod:`provided_code.data.patient_plan`), into ``DATA_DIR/train-pats/pt_<N>`` or
``DATA_DIR/validation-pats/pt_<N>``.

- Pseudonyms: ``pt_<N>``, numbered in the order of a hash of the PatientID, after those an earlier
  run gave; the identity map (``pseudonym,patient_id``, by default ``DATA_DIR/identity-map.csv``,
  readable by its owner only) is the only place that links them. The patient folders carry the
  pseudonym where the CT had the patient's name and ID, and none of the other identifying tags
  (:data:`~provided_code.dicom.ct_series.IDENTIFYING_TAGS`: birth date, sex, study date and time,
  ID, description, accession number, referring physician).
- Split: a patient is in validation when a hash of its PatientID and the seed falls below the
  fraction (``validation`` < 1), or, for a count, among the new patients of lowest hash until the
  count is reached; a patient keeps the split an earlier run gave it, so adding patients never
  moves one.
- ``DATA_DIR/manifest.csv``: one row per patient and plan (and per left series, object and skipped
  file), its status (imported, skipped, failed) and reason, the source UIDs and what was chosen. It
  holds no path in the archive (PACS exports name folders after patients): it numbers them
  (``#<N>``), and the sources file beside the identity map (``identity-map.sources.csv``, as
  private) says which path each number is.
- One patient's failure is a row and a count (``strict`` raises it instead, naming the pseudonym).
  An earlier import of a patient that now fails or has no plan chosen is moved out of its split,
  whole, to ``DATA_DIR/withdrawn/pt_<N>-<time>`` (never deleted), and its row says so.
- Rerunnable: a patient whose sources (SOP Instance UIDs, sizes, modification times) and settings
  are those of its earlier import is not imported again; a killed run resumes from its journal
  (``DATA_DIR/.import-cohort.journal``); each patient folder is moved into place whole.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Callable

from provided_code.data.patient_plan import write_beams, write_prescriptions
from provided_code.dicom.archive import Candidate, PatientLinks, link_patients, scan_archive
from provided_code.dicom.ct_series import IDENTIFYING_TAGS
from provided_code.dicom.names import load_names
from provided_code.dicom.rtplan import plan_prescriptions
from provided_code.errors import UserError
from provided_code.sites import Site, load_site
from provided_code.infra.atomic import fsync_folder, write_text_atomic
from provided_code.infra.progress import Progress, no_progress

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.csv"
IDENTITY_FILE = "identity-map.csv"
SOURCES_SUFFIX = ".sources.csv"  # the archive paths the manifest numbers: beside the identity map, named after it
JOURNAL_FILE = ".import-cohort.journal"
WITHDRAWN_DIR = "withdrawn"  # earlier imports of patients that now fail or have no plan chosen, moved out of the splits
SPLITS = {"train": "train-pats", "validation": "validation-pats"}
MANIFEST_FIELDS = ("pseudonym", "status", "reason", "kind", "split", "plan_uid", "plan_label", "plan_date",
                   "approval", "dose_summation", "dose_uids", "structure_set_uid", "ct_series_uid",
                   "frame_of_reference_uid", "prescriptions_gy", "beams", "modality", "uid", "source", "fingerprint")
IMPORT_VERSION = 2  # part of each fingerprint: a change of what an import writes re-imports everyone
# (2: dicom.json keeps none of the CT's IDENTIFYING_TAGS)


class CohortError(UserError, ValueError):
    """A cohort-wide problem: the archive, the output folder, the identity map."""


@dataclasses.dataclass
class CohortReport:
    out: Path
    counts: dict[str, int]  # imported (this run), unchanged, skipped, failed patients
    rows: list[dict[str, str]]
    lines: list[str]
    withdrawn: list[str] = dataclasses.field(default_factory=list)  # "train-pats/pt_3 moved to withdrawn/pt_3-..."
    objects: dict[str, int] = dataclasses.field(default_factory=dict)  # the archive's DICOM objects by modality
    files_skipped: int = 0  # the archive's files that are no object: DICOMDIR, not DICOM, unreadable, duplicates

    @property
    def failed(self) -> int:
        return self.counts["failed"]

    def summary(self) -> str:
        c = self.counts
        lines = [f"{c['imported']} patients imported, {c['unchanged']} unchanged since an earlier import, "
                 f"{c['skipped']} skipped, {c['failed']} failed ({self.out / MANIFEST_FILE})"]
        if self.withdrawn:
            lines.append(f"{len(self.withdrawn)} earlier import(s) of patients now failed or skipped taken out of the "
                         f"training set: {'; '.join(self.withdrawn)}")
        kinds = ", ".join(f"{modality} {count}" for modality, count in sorted(self.objects.items()))
        lines.append(f"The archive: {sum(self.objects.values())} DICOM objects ({kinds}), "
                     f"{self.files_skipped} other files skipped")
        return "\n".join(lines)


def _unit_hash(*parts: str) -> float:
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


def _read_csv(path: Path, columns: tuple[str, ...] | None = None, what: str = "") -> list[dict[str, str]]:
    """The rows of ``path`` ([] when absent); with ``columns``, a :class:`CohortError` naming the file
    as not ``what`` unless its header is those columns."""
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if columns is not None and rows and set(rows[0]) != set(columns):
        raise CohortError(f"{path}: not {what} (header {','.join(columns)})")
    return rows


def _csv_text(fields, rows) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def _number(pseudonym: str) -> int:
    return int(pseudonym[3:]) if pseudonym.startswith("pt_") and pseudonym[3:].isdigit() else 0


class _Sources:
    """The archive paths the manifest refers to, by number (``#<N>``): PACS exports name folders
    after their patients, so the paths are kept apart from the manifest, beside the identity map
    and as private (``source,path``, the path relative to the archive, a folder's ending in ``/``).
    A path keeps its number on every later run."""

    def __init__(self, path: Path, archive: Path):
        self.path, self.archive = path, archive
        rows = _read_csv(path, ("source", "path"), "a sources file of an import")
        self.numbers = {row["path"]: row["source"] for row in rows}
        self.next = 1 + max(map(_source_number, self.numbers.values()), default=0)

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
                      key=lambda row: _source_number(row["source"]))
        write_text_atomic(self.path, _csv_text(("source", "path"), rows), mode=0o600)


def _source_number(source: str) -> int:
    return int(source[1:]) if source[:1] == "#" and source[1:].isdigit() else 0


def _message(error: BaseException) -> str:
    """An error's message in one line."""
    if isinstance(error, OSError) and not isinstance(error, UserError) and error.filename is not None:
        return f"{error.filename}: {error.strerror or error}"
    return " ".join(str(error).split()) or type(error).__name__


class _State:
    """What earlier runs left in ``out``: pseudonyms, splits, imports and their fingerprints."""

    def __init__(self, out: Path, identity_path: Path):
        self.out, self.identity_path = out, identity_path
        identity = _read_csv(identity_path, ("pseudonym", "patient_id"), "an identity map")
        self.pseudonyms = {row["patient_id"]: row["pseudonym"] for row in identity}
        self.rows = _read_csv(out / MANIFEST_FILE)
        if (out / MANIFEST_FILE).is_file() and not identity_path.is_file():
            raise CohortError(f"{identity_path}: missing, while {out / MANIFEST_FILE} holds an earlier import; pass "
                              f"--identity-map with the map of that import (pseudonyms must stay the same)")
        self.splits = {row["pseudonym"]: row["split"] for row in self.rows if row.get("split")}
        self.imports = {row["pseudonym"]: row["fingerprint"] for row in self.rows
                        if row.get("kind") == "plan" and row.get("status") == "imported"}
        self.withdrawn: dict[str, str] = {}  # pseudonym -> where its earlier import went, this run
        for entry in self._journal():
            self.splits[entry["pseudonym"]] = entry["split"]
            if entry.get("withdrawn"):
                self.withdrawn[entry["pseudonym"]] = entry["withdrawn"]
            if entry["status"] == "imported":
                self.imports[entry["pseudonym"]] = entry["fingerprint"]
            else:
                self.imports.pop(entry["pseudonym"], None)
        for split, folder in SPLITS.items():  # folders without a record (a run killed before its journal line)
            for path in (out / folder).glob("pt_*"):
                self.splits.setdefault(path.name, split)

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

    def assign_pseudonyms(self, patient_ids: list[str]) -> None:
        """Pseudonyms for new patients (after the highest given), written before anything is imported."""
        new = sorted((p for p in patient_ids if p not in self.pseudonyms), key=lambda p: (_unit_hash("pseudonym", p), p))
        if not new:
            return
        number = max((_number(p) for p in self.pseudonyms.values()), default=0)
        for patient_id in new:
            number += 1
            self.pseudonyms[patient_id] = f"pt_{number}"
        rows = sorted(({"pseudonym": p, "patient_id": i} for i, p in self.pseudonyms.items()),
                      key=lambda r: _number(r["pseudonym"]))
        # the map re-identifies the cohort: its owner's only, from the temporary file's creation on
        write_text_atomic(self.identity_path, _csv_text(("pseudonym", "patient_id"), rows), mode=0o600)

    def assign_splits(self, patient_ids: list[str], validation: float | int, seed: int) -> None:
        new = [p for p in patient_ids if self.pseudonyms[p] not in self.splits]
        if isinstance(validation, int):
            have = sum(split == "validation" for split in self.splits.values())
            ranked = sorted(new, key=lambda p: (_unit_hash(str(seed), p), p))
            chosen = set(ranked[:max(0, validation - have)])
            for patient_id in new:
                self.splits[self.pseudonyms[patient_id]] = "validation" if patient_id in chosen else "train"
        else:
            for patient_id in new:
                low = _unit_hash(str(seed), patient_id) < validation
                self.splits[self.pseudonyms[patient_id]] = "validation" if low else "train"

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


def _settings(site: Site, table: dict[str, tuple[str, ...]], allow_missing_targets: bool) -> str:
    """What of the run an import depends on, for the fingerprint: the site's targets and
    prescriptions, the names table (every structure and BODY, its ROI names), and the site's name
    (the sidecar holds it) and grid, these two only when not OpenKBP's, so that the fingerprints
    of imports made before sites stay the same."""
    settings = [site.prescriptions_gy, {k: sorted(v) for k, v in table.items()}, allow_missing_targets]
    if site.name != "openkbp" or site.grid != load_site("openkbp").grid:
        settings.append({"site": site.name, "grid": site.grid})
    return json.dumps(settings, sort_keys=True)


def _fingerprint(candidate: Candidate, settings: str) -> str:
    sources = sorted(o.fingerprint for o in candidate.sources())
    return hashlib.sha256(json.dumps([IMPORT_VERSION, settings, sources]).encode()).hexdigest()[:32]


def _beams_text(candidate: Candidate) -> str:
    parts = []
    for beam in candidate.info.beams:
        text = f"{beam.gantry_start:g}" if beam.type == "static" else \
            f"{beam.gantry_start:g}-{beam.gantry_stop:g} {beam.direction}"
        parts.append(text + (f" couch {beam.couch:g}" if beam.couch else ""))
    return "; ".join(parts)


def _plan_row(candidate: Candidate, pseudonym: str, split: str) -> dict[str, str]:
    info = candidate.info
    return {"pseudonym": pseudonym, "kind": "plan", "split": split, "plan_uid": info.sop_instance_uid,
            "plan_label": info.label, "plan_date": info.date_time, "approval": info.approval,
            "dose_summation": (candidate.dose_summation + (f" × {candidate.dose_scale:g}"
                                                            if candidate.dose_scale != 1 else "")
                               + (f" ({len(candidate.doses)} summed)" if len(candidate.doses) > 1 else "")),
            "dose_uids": " ".join(d.sop_instance_uid for d in candidate.doses),
            "structure_set_uid": candidate.structure_set.sop_instance_uid if candidate.structure_set else "",
            "ct_series_uid": candidate.ct_series_uid,
            "frame_of_reference_uid": candidate.structure_set.frame_of_reference_uid if candidate.structure_set else "",
            "beams": _beams_text(candidate), "modality": "RTPLAN", "uid": info.sop_instance_uid}


def import_cohort(archive: os.PathLike | str, out: os.PathLike | str, *, site: Site | str | None = None,
                  names_file: os.PathLike | str | None = None, validation: float | int = 0.2, seed: int = 0,
                  strict: bool = False, identity_map: os.PathLike | str | None = None,
                  allow_missing_targets: bool = False, progress: Progress = no_progress, workers: int | None = None,
                  after_patient: Callable[[str], None] | None = None) -> CohortReport:
    """Import every patient of the archive (see the module docstring) for ``site`` (a
    :class:`~provided_code.sites.Site` or what :func:`~provided_code.sites.load_site` takes; None:
    OpenKBP): its structures matched from its DICOM names, with ``names_file``'s in their place
    (:func:`provided_code.dicom.names.load_names`); its targets' prescriptions the defaults of each
    ``prescriptions.csv``. ``after_patient(pseudonym)`` is called after each patient's outcome is recorded."""
    from provided_code.dicom.importer import import_patient

    archive, out = Path(archive), Path(out)
    if not archive.is_dir():
        raise CohortError(f"{archive}: archive folder does not exist or is not a folder")
    validation = parse_validation(validation)
    site = load_site(site)
    table = load_names(names_file, site)
    identity_path = Path(identity_map) if identity_map else out / IDENTITY_FILE
    state = _State(out, identity_path)
    sources = _Sources(identity_path.with_suffix(SOURCES_SUFFIX), archive)

    index = scan_archive(archive, progress, workers)
    patients = link_patients(index)
    if not index.objects:
        raise CohortError(f"{archive}: no DICOM object among its {len(index.skipped_files)} files")
    out.mkdir(parents=True, exist_ok=True)  # only once there is something to import
    if identity_path.resolve().is_relative_to(out.resolve()):
        logger.warning("%s (pseudonym -> PatientID) is inside the data folder: keep %s off shared storage, or pass "
                       "--identity-map with a private path", identity_path, out)
    state.assign_pseudonyms([p.patient_id for p in patients])
    refused = [p for p in patients if p.refusal]
    if strict and refused:
        raise CohortError(f"{state.pseudonyms[refused[0].patient_id]}: {refused[0].refusal}")
    state.assign_splits([p.patient_id for p in patients if p.chosen], validation, seed)
    settings = _settings(site, table, allow_missing_targets)

    counts = {"imported": 0, "unchanged": 0, "skipped": 0, "failed": 0}
    rows: list[dict[str, str]] = []
    lines: list[str] = []
    present = {p.patient_id for p in patients}
    todo = [p for p in patients if p.chosen]
    outcomes = {}
    for links in progress(todo, len(todo), "Importing patients"):
        pseudonym = state.pseudonyms[links.patient_id]
        split = state.splits[pseudonym]
        fingerprint = _fingerprint(links.chosen, settings)
        folder = out / SPLITS[split] / pseudonym
        info = links.chosen.info
        try:
            prescriptions, plan_lines = plan_prescriptions(info, site.prescriptions_gy, table,
                                                           dict(links.chosen.structure_set.roi_names))
            prescribed = " ".join(f"{k}={v:g}" for k, v in prescriptions.items())
            if state.imports.get(pseudonym) == fingerprint and folder.is_dir():
                outcomes[links.patient_id] = ("imported", "; ".join(info.warnings), fingerprint, prescribed)
                counts["unchanged"] += 1
                continue

            def extra(staging: Path, prescriptions=prescriptions, beams=info.beams) -> None:
                write_prescriptions(staging, prescriptions)
                if beams:
                    write_beams(staging, [beam.as_row() for beam in beams])

            import_patient([o.path for o in links.chosen.ct_files], links.chosen.structure_set.path, folder,
                           rtdose=[d.path for d in links.chosen.doses], names=table, site=site,
                           allow_missing_targets=allow_missing_targets, dose_scale=links.chosen.dose_scale,
                           patient_tags={**dict.fromkeys(IDENTIFYING_TAGS, ""), "PatientName": pseudonym,
                                         "PatientID": pseudonym},
                           also_write=extra)
            for warning in info.warnings:
                logger.warning("%s: %s", pseudonym, warning)
            outcomes[links.patient_id] = ("imported", "; ".join(info.warnings), fingerprint, prescribed)
            counts["imported"] += 1
            state.record({"pseudonym": pseudonym, "split": split, "status": "imported", "fingerprint": fingerprint})
            logger.info("%s: imported %s into %s (%s)", pseudonym, links.chosen.describe(), folder,
                        "; ".join(plan_lines))
        except Exception as error:  # noqa: BLE001 - one patient's problem never stops the cohort
            user_error = isinstance(error, (UserError, OSError))
            message = _message(error).replace(str(archive) + os.sep, "")
            if strict:
                if user_error:
                    raise CohortError(f"{pseudonym}: {message}") from error
                raise
            if not user_error:
                logger.exception("%s: import failed", pseudonym)  # a bug, not the data: the traceback too
            # the manifest numbers the archive's paths (folders named after the patient); the sources file holds them
            reason = sources.scrub(_message(error), [o.path for o in links.chosen.sources()])
            outcomes[links.patient_id] = ("failed", reason, "", "")
            counts["failed"] += 1
            state.record({"pseudonym": pseudonym, "split": split, "status": "failed", "fingerprint": ""})
            logger.warning("%s: import failed: %s", pseudonym, message)
            state.withdraw(pseudonym)
        if after_patient is not None:
            after_patient(pseudonym)

    for links in patients:
        pseudonym = state.pseudonyms[links.patient_id]
        if not links.chosen:
            state.withdraw(pseudonym)
        rows += _patient_rows(links, pseudonym, state.splits.get(pseudonym, ""), outcomes.get(links.patient_id))
        if pseudonym in state.withdrawn:
            note = f"; its earlier import was taken out of the training set: {state.withdrawn[pseudonym]}"
            for row in rows:
                if row["pseudonym"] == pseudonym and row["kind"] in ("plan", "patient") and row["status"] != "imported":
                    row["reason"] += note
        if not links.chosen:
            counts["failed" if links.refusal else "skipped"] += 1
            if links.refusal:
                lines.append(f"{pseudonym}: {links.refusal}")
    for path, why in index.skipped_files:
        rows.append({"pseudonym": "", "status": "skipped", "kind": "file", "source": sources.ref(path),
                     "reason": sources.scrub(why, [path, index.duplicate_of.get(path)])})
    # patients an earlier run imported and this archive no longer holds: their rows and folders stay
    gone = {state.pseudonyms[p] for p in state.pseudonyms if p not in present}
    rows += [row for row in state.rows if row.get("pseudonym") in gone]
    rows.sort(key=lambda r: (r["pseudonym"] == "", _number(r["pseudonym"]), r.get("kind") != "plan",
                             _source_number(r.get("source", "")), r.get("uid", "")))
    sources.write()  # before the manifest: every number it holds is there
    write_text_atomic(out / MANIFEST_FILE, _csv_text(MANIFEST_FIELDS, rows))
    (out / JOURNAL_FILE).unlink(missing_ok=True)
    back = {state.pseudonyms[p] for p, outcome in outcomes.items() if outcome[0] == "imported"}  # (after a kill)
    withdrawn = [state.withdrawn[p] for p in sorted(state.withdrawn, key=_number) if p not in back]
    return CohortReport(out, counts, rows, lines, withdrawn, index.counts(), len(index.skipped_files))


def _patient_rows(links: PatientLinks, pseudonym: str, split: str, outcome) -> list[dict[str, str]]:
    rows = []
    if not links.candidates:
        rows.append({"pseudonym": pseudonym, "status": "skipped", "kind": "patient",
                     "reason": "no RT Plan of this patient in the archive"})
    for candidate in links.candidates:
        row = _plan_row(candidate, pseudonym, split if candidate is links.chosen else "")
        if candidate is links.chosen:
            status, reason, fingerprint, prescribed = outcome
            if status == "imported":
                reason = "; ".join(["chosen", *([reason] if reason else [])])
            row.update(status=status, reason=reason, fingerprint=fingerprint, prescriptions_gy=prescribed)
        elif candidate.reason:
            row.update(status="skipped", reason=candidate.reason)
        elif links.refusal:
            row.update(status="failed", reason=links.refusal)
        else:
            row.update(status="skipped", reason=f"older than the chosen {links.chosen.describe()}")
        rows.append(row)
    for kind, modality, uid, why in links.left:
        rows.append({"pseudonym": pseudonym, "status": "skipped", "reason": why, "kind": kind, "modality": modality,
                     "uid": uid})
    return rows
