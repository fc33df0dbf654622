"""``openkbp-dicom import-cohort``: a clinic's DICOM archive to a training set.

The archive is scanned and linked (:mod:`provided_code.dicom.archive`), one plan chosen per
patient, and each chosen patient imported for the site as ``openkbp-dicom import`` imports one
(:func:`~provided_code.dicom.importer.import_patient`), with the plan's ``prescriptions.csv`` and
``beams.csv`` (:mod:`provided_code.data.patient_plan`), into ``DATA_DIR/train-pats/pt_<N>`` or
``DATA_DIR/validation-pats/pt_<N>``.

- Pseudonyms, splits and the archive's paths by number: :mod:`provided_code.dicom.pseudonyms`.
  The patient folders carry the pseudonym where the CT had the patient's name and ID, and none of
  the other identifying tags (:data:`~provided_code.dicom.ct_series.IDENTIFYING_TAGS`: birth date,
  sex, study date and time, ID, description, accession number, referring physician).
- ``DATA_DIR/manifest.csv`` (:mod:`provided_code.dicom.ledger`): one row per patient and plan (and
  per left series, object and skipped file), its status (imported, skipped, failed) and reason, the
  source UIDs and what was chosen; no path in the archive, only its number (``#<N>``).
- One patient's failure is a row and a count (``strict`` raises it instead, naming the pseudonym).
  An earlier import of a patient that now fails or has no plan chosen is moved out of its split,
  whole, to ``DATA_DIR/withdrawn/pt_<N>-<time>`` (never deleted), and its row says so.
- Each patient's import warnings (missing structures, slices without contours, contours left out,
  the plan's couch) are in its row's reason, on the console and counted in the summary; the site's
  targets it lacks in ``missing_targets`` (an optional target's absence is one of those warnings).
- Rerunnable: a patient whose sources (SOP Instance UIDs, sizes, modification times) and settings
  (those that change what its import writes) are those of its earlier import is not imported
  again; a killed run resumes from its journal (``DATA_DIR/.import-cohort.journal``); each patient
  folder is moved into place whole. A rerun needs the data folder's own identity map (a cohort
  identifier in both) and its site (unless ``change_site``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Callable

from provided_code.data.patient_plan import write_beams, write_prescriptions
from provided_code.dicom.archive import Candidate, PatientLinks, link_patients, scan_archive
from provided_code.dicom.ct_series import IDENTIFYING_TAGS
from provided_code.dicom.errors import CohortError, DicomInputError, require_site
from provided_code.dicom.grid import SIDECAR_FILE, PatientGeometry
from provided_code.dicom.ledger import (JOURNAL_FILE, MANIFEST_FIELDS, MANIFEST_FILE, SPLITS, EarlierImport, Ledger,
                                       csv_text)
from provided_code.dicom.names import load_names
from provided_code.dicom.pseudonyms import (IDENTITY_FILE, IdentityMap, Sources, assign_splits, moved_pseudonyms,
                                            parse_validation, pseudonym_number, source_number)
from provided_code.dicom.rtplan import plan_prescriptions
from provided_code.errors import UserError
from provided_code.sites import Site, openkbp
from provided_code.infra.progress import Progress, no_progress

logger = logging.getLogger(__name__)

__all__ = ["CohortError", "CohortReport", "import_cohort", "JOURNAL_FILE", "MANIFEST_FILE", "IDENTITY_FILE"]

IMPORT_VERSION = 2  # part of each fingerprint: a change of what an import writes re-imports everyone
# (2: dicom.json keeps none of the CT's IDENTIFYING_TAGS)


@dataclasses.dataclass
class CohortReport:
    out: Path
    counts: dict[str, int]  # imported (this run), unchanged, skipped, failed patients
    rows: list[dict[str, str]]
    lines: list[str]
    withdrawn: list[str] = dataclasses.field(default_factory=list)  # "train-pats/pt_3 moved to withdrawn/pt_3-..."
    objects: dict[str, int] = dataclasses.field(default_factory=dict)  # the archive's DICOM objects by modality
    files_skipped: int = 0  # the archive's files that are no object: DICOMDIR, not DICOM, unreadable, duplicates
    with_warnings: int = 0  # imported (this run or earlier) patients whose manifest reason holds warnings
    plans_apart: int = 0  # patients with a plan set aside on a CT of another study and frame of reference

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
        if self.with_warnings:
            lines.append(f"{self.with_warnings} of the imported patients with warnings (missing structures, slices, "
                         f"the plan; each in its manifest row's reason)")
        if self.plans_apart:
            lines.append(f"{self.plans_apart} patient(s) with a plan set aside on a CT of another study and frame of "
                         f"reference than the chosen plan's: two patients under one PatientID, or a new planning CT? "
                         f"(each in its plan rows' reason)")
        return "\n".join(lines)


def _message(error: BaseException) -> str:
    """An error's message in one line."""
    if isinstance(error, OSError) and not isinstance(error, UserError) and error.filename is not None:
        return f"{error.filename}: {error.strerror or error}"
    return " ".join(str(error).split()) or type(error).__name__


def _settings(site: Site, table: dict[str, tuple[str, ...]]) -> str:
    """What of the run an import's output depends on, for the fingerprint: the site's targets and
    prescriptions, the names table (every structure and BODY, its ROI names), and the site's name
    (the sidecar holds it) and grid, these two only when not OpenKBP's, so that the fingerprints
    of imports made before sites stay the same. ``--allow-missing-targets`` changes no import's
    output, only whether a patient without a required target is imported (a patient that lacks
    one is imported again when the flag is gone: :func:`_unchanged`); its place holds False, as
    the imports made without the flag had it, so that their fingerprints stay the same."""
    settings = [site.prescriptions_gy, {k: sorted(v) for k, v in table.items()}, False]
    if site.name != "openkbp" or site.grid != openkbp().grid:
        settings.append({"site": site.name, "grid": site.grid})
    return json.dumps(settings, sort_keys=True)


def _check_site(out: Path, site: Site, change_site: bool) -> None:
    """Refuse a run for another site than the one the data folder's patients were imported for (their
    ``dicom.json``), unless ``change_site``: it would import every patient again, and withdraw those
    that fail for the new site."""
    for folder in sorted(p for split in SPLITS.values() for p in (out / split).glob("pt_*")):
        try:
            earlier = PatientGeometry.read(folder).site
        except DicomInputError:
            continue
        if earlier != site.name and not change_site:
            raise CohortError(f"Invalid `site`. Expected the data folder's site, {earlier} ({folder / SIDECAR_FILE}), "
                              f"or --change-site to import every patient again for {site.name}. "
                              f"Received: site={site.name!r}")
        return


def _unchanged(earlier: EarlierImport | None, fingerprint: str, folder: Path, site: Site,
               allow_missing_targets: bool) -> bool:
    """Whether the earlier import of a patient stands: of the same sources and settings, its folder
    there, and not lacking a required target unless that is still allowed."""
    if earlier is None or earlier.fingerprint != fingerprint or not folder.is_dir():
        return False
    return allow_missing_targets or not set(earlier.missing_targets) & set(site.required_targets)


def _fingerprint(candidate: Candidate, settings: str) -> str:
    sources = sorted(o.fingerprint for o in candidate.sources())
    return hashlib.sha256(json.dumps([IMPORT_VERSION, settings, sources]).encode()).hexdigest()[:32]


def _prescribed(prescriptions: dict[str, float], missing: tuple[str, ...]) -> str:
    """The manifest's ``prescriptions_gy``: those written, of the targets the patient has."""
    return " ".join(f"{k}={v:g}" for k, v in prescriptions.items() if k not in missing)


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


def import_cohort(archive: os.PathLike | str, out: os.PathLike | str, *, site: Site,
                  names_file: os.PathLike | str | None = None, validation: float | int = 0.2, seed: int = 0,
                  strict: bool = False, identity_map: os.PathLike | str | None = None,
                  allow_missing_targets: bool = False, change_site: bool = False, reassign_pseudonyms: bool = False,
                  progress: Progress = no_progress,
                  workers: int | None = None, after_patient: Callable[[str], None] | None = None) -> CohortReport:
    """Import every patient of the archive (see the module docstring) for ``site`` (a
    :class:`~provided_code.sites.Site`): its structures matched from its DICOM names, with ``names_file``'s in their place
    (:func:`provided_code.dicom.names.load_names`); its targets' prescriptions the defaults of each
    ``prescriptions.csv``. ``after_patient(pseudonym)`` is called after each patient's outcome is recorded.

    A data folder imported for another site is refused unless ``change_site`` (every patient is
    then imported again for ``site``), and an identity map of another data folder always; one that
    gives a pseudonym to another patient of the archive than the one it was given to (two rows
    swapped by hand) unless ``reassign_pseudonyms``, and one that gives an imported pseudonym to no
    patient of the archive while its patient is there (a PatientID mistyped) always.

    The steps: the data folder's earlier import opened and checked (:func:`_open_import`); the
    archive scanned and its patients linked; the pseudonyms checked against the earlier import's
    (:func:`_check_pseudonyms`); each new patient given a pseudonym and a split; each chosen patient
    imported (:func:`_import_patient`); the manifest written (:func:`_manifest`)."""
    archive, out = Path(archive), Path(out)
    if not archive.is_dir():
        raise CohortError(f"{archive}: archive folder does not exist or is not a folder")
    validation = parse_validation(validation)
    run = _open_import(archive, out, require_site(site), names_file, identity_map, change_site)

    index = scan_archive(archive, progress, workers)
    patients = link_patients(index)
    if not index.objects:
        raise CohortError(f"{archive}: no DICOM object among its {len(index.skipped_files)} files")
    _check_pseudonyms(run, patients, index, reassign_pseudonyms)

    out.mkdir(parents=True, exist_ok=True)  # only once there is something to import
    if run.identity_path.resolve().is_relative_to(out.resolve()):
        logger.warning("%s (pseudonym -> PatientID) is inside the data folder: keep %s off shared storage, or pass "
                       "--identity-map with a private path", run.identity_path, out)
    run.identity.assign([p.patient_id for p in patients])
    refused = [p for p in patients if p.refusal]
    if strict and refused:
        raise CohortError(f"{run.identity.label(refused[0].patient_id)}: {refused[0].refusal}")
    assign_splits(run.ledger.splits, run.identity.pseudonyms, [p.patient_id for p in patients if p.chosen],
                  validation, seed)

    counts = {"imported": 0, "unchanged": 0, "skipped": 0, "failed": 0}
    lines: list[str] = []
    outcomes = {}
    todo = [p for p in patients if p.chosen]
    for links in progress(todo, len(todo), "Importing patients"):
        pseudonym = run.identity.pseudonyms[links.patient_id]
        outcomes[links.patient_id], kind, line = _import_patient(run, links, pseudonym, strict, allow_missing_targets)
        counts[kind] += 1
        if line:
            lines.append(line)
        if kind != "unchanged" and after_patient is not None:
            after_patient(pseudonym)
    return _manifest(run, index, patients, outcomes, counts, lines)


@dataclasses.dataclass
class _Import:
    """One run of :func:`import_cohort`: where it writes, what it matches names with, and the data
    folder's earlier import (its identity map, ledger and the archive's numbered paths)."""

    out: Path
    site: Site
    table: dict[str, tuple[str, ...]]
    settings: str  # what changes what an import writes (:func:`_settings`), part of each fingerprint
    identity_path: Path
    identity: IdentityMap
    ledger: Ledger
    sources: Sources


def _open_import(archive: Path, out: Path, site: Site, names_file, identity_map, change_site: bool) -> _Import:
    """The data folder's earlier import, read and checked before the archive is scanned: its identity
    map is the one it was imported with, its site this one (unless ``change_site``)."""
    table = load_names(names_file, site)
    identity_path = Path(identity_map) if identity_map else out / IDENTITY_FILE
    identity, ledger = IdentityMap(identity_path), Ledger(out)
    if ledger.has_manifest and not identity.exists:
        raise CohortError(f"{identity_path}: missing, while {out / MANIFEST_FILE} holds an earlier import; pass "
                          f"--identity-map with the map of that import (pseudonyms must stay the same)")
    identity.check_belongs_to(out, ledger.rows)
    _check_site(out, site, change_site)
    return _Import(out, site, table, _settings(site, table), identity_path, identity, ledger,
                   Sources.beside(identity_path, archive))


def _check_pseudonyms(run: _Import, patients: list[PatientLinks], index, reassign_pseudonyms: bool) -> None:
    """Refuse an identity map whose pseudonyms moved between the archive's patients since the
    earlier import (unless ``reassign_pseudonyms``, and never when a moved pseudonym's patient would
    then be imported twice)."""
    identity, identity_path = run.identity, run.identity_path
    moved = moved_pseudonyms(identity, run.ledger.pseudonym_of_object(), index.owners())
    held = {identity.pseudonyms[link.patient_id] for link in patients if link.patient_id in identity.pseudonyms}
    stranded = [phrase for pseudonym, phrase in moved.items() if pseudonym not in held]
    if stranded:  # its earlier import would stay, beside its patient's import under another pseudonym: twice
        raise CohortError(f"Invalid `identity_map`. Expected each pseudonym taken off its patient given to another "
                          f"patient of the archive, or on the line of the PatientID its patient has there (else its "
                          f"earlier import stays beside the patient's import under another pseudonym: the patient twice "
                          f"in the training set, which --reassign-pseudonyms does not allow). Received: "
                          f"identity_map={str(identity_path)!r}, in which " + "; ".join(stranded))
    if moved and not reassign_pseudonyms:
        raise CohortError(f"Invalid `identity_map`. Expected each pseudonym kept for the archive's patient it was "
                          f"given to (the plan {run.out / MANIFEST_FILE} lists as imported under it), or "
                          f"--reassign-pseudonyms if the change is meant. Received: "
                          f"identity_map={str(identity_path)!r}, in which "
                          + "; ".join(moved.values()))
    if moved:
        logger.warning("%s: pseudonyms given to other patients (--reassign-pseudonyms), who are imported under them: "
                       "%s", identity_path, "; ".join(moved.values()))


def _import_patient(run: _Import, links: PatientLinks, pseudonym: str, strict: bool,
                    allow_missing_targets: bool) -> tuple[tuple, str, str]:
    """``(outcome, kind, line)``: one chosen patient imported into its split's folder (or found
    unchanged since its earlier import), recorded in the ledger; ``kind`` the count it adds to
    (imported, unchanged, failed), ``line`` what the console says of it ("" for nothing). A
    patient's failure is its outcome, never the cohort's, unless ``strict``."""
    from provided_code.dicom.importer import import_patient

    ledger, sources, site = run.ledger, run.sources, run.site
    split = ledger.splits[pseudonym]
    fingerprint = _fingerprint(links.chosen, run.settings)
    folder = run.out / SPLITS[split] / pseudonym
    info = links.chosen.info
    paths = [o.path for o in links.chosen.sources()]
    try:
        prescriptions, plan_lines = plan_prescriptions(info, site.prescriptions_gy, run.table,
                                                       dict(links.chosen.structure_set.roi_names))
        earlier = ledger.imports.get(pseudonym)
        if _unchanged(earlier, fingerprint, folder, site, allow_missing_targets):
            return (("imported", earlier.warnings, fingerprint, _prescribed(prescriptions, earlier.missing_targets),
                     earlier.missing_targets), "unchanged", "")

        def extra(staging: Path, targets: tuple[str, ...], prescriptions=prescriptions, beams=info.beams) -> None:
            write_prescriptions(staging, {t: gy for t, gy in prescriptions.items() if t in targets})
            if beams:
                write_beams(staging, [beam.as_row() for beam in beams])

        report = import_patient([o.path for o in links.chosen.ct_files], links.chosen.structure_set.path, folder,
                                rtdose=[d.path for d in links.chosen.doses], names=run.table, site=site,
                                allow_missing_targets=allow_missing_targets, dose_scale=links.chosen.dose_scale,
                                patient_tags={**dict.fromkeys(IDENTIFYING_TAGS, ""), "PatientName": pseudonym,
                                              "PatientID": pseudonym},
                                also_write=extra)
        warnings = sources.scrub("; ".join([*info.warnings, *report.warnings]), paths)
        missing = tuple(report.missing_targets)
        line = ""
        if warnings:
            logger.warning("%s: %s", pseudonym, warnings)
            line = f"{pseudonym}: imported with warnings: {warnings}"
        ledger.record({"pseudonym": pseudonym, "split": split, "status": "imported", "fingerprint": fingerprint,
                       "missing_targets": list(missing), "warnings": warnings})
        logger.info("%s: imported %s into %s (%s)", pseudonym, links.chosen.describe(), folder, "; ".join(plan_lines))
        return ("imported", warnings, fingerprint, _prescribed(prescriptions, missing), missing), "imported", line
    except Exception as error:  # noqa: BLE001 - one patient's problem never stops the cohort
        user_error = isinstance(error, (UserError, OSError))
        # the archive's paths by their numbers (folders named after the patient); the sources file holds them
        reason = sources.scrub(_message(error), paths)
        if strict:
            if user_error:
                raise CohortError(f"{pseudonym}: {reason}") from error
            raise
        if not user_error:
            logger.exception("%s: import failed", pseudonym)  # a bug, not the data: the traceback too
        ledger.record({"pseudonym": pseudonym, "split": split, "status": "failed", "fingerprint": ""})
        logger.warning("%s: import failed: %s", pseudonym, reason)
        ledger.withdraw(pseudonym)
        return ("failed", reason, "", "", ()), "failed", ""


def _manifest(run: _Import, index, patients: list[PatientLinks], outcomes: dict, counts: dict[str, int],
              lines: list[str]) -> CohortReport:
    """The manifest written whole (one row per patient, plan, left object and skipped file; the
    rows of patients this archive no longer holds kept), the withdrawn earlier imports said, and
    the run's report."""
    identity, ledger, sources = run.identity, run.ledger, run.sources
    rows: list[dict[str, str]] = []
    present = {p.patient_id for p in patients}
    for links in patients:
        pseudonym = identity.pseudonyms.get(links.patient_id, "")  # objects without a PatientID have none
        if not links.chosen and pseudonym:
            ledger.withdraw(pseudonym)
        rows += _patient_rows(links, pseudonym, ledger.splits.get(pseudonym, ""), outcomes.get(links.patient_id))
        if pseudonym in ledger.withdrawn:
            note = f"; its earlier import was taken out of the training set: {ledger.withdrawn[pseudonym]}"
            for row in rows:
                if row["pseudonym"] == pseudonym and row["kind"] in ("plan", "patient") and row["status"] != "imported":
                    row["reason"] += note
        for warning in links.warnings:  # plans set aside on a CT of another study and frame: each run, until settled
            logger.warning("%s: %s", pseudonym, warning)
            lines.append(f"{pseudonym}: warning: {warning}")
        if not links.chosen and (links.patient_id or links.refusal):  # objects without an ID and a plan: no patient
            counts["failed" if links.refusal else "skipped"] += 1
            if links.refusal:
                lines.append(f"{identity.label(links.patient_id)}: {links.refusal}")
    for path, why in index.skipped_files:
        rows.append({"pseudonym": "", "status": "skipped", "kind": "file", "source": sources.ref(path),
                     "reason": sources.scrub(why, [path, index.duplicate_of.get(path)])})
    # patients an earlier run imported and this archive no longer holds: their rows and folders stay
    gone = {identity.pseudonyms[p] for p in identity.pseudonyms if p not in present}
    rows += [row for row in ledger.rows if row.get("pseudonym") in gone]
    rows.sort(key=lambda r: (r["pseudonym"] == "", pseudonym_number(r["pseudonym"]), r.get("kind") != "plan",
                             source_number(r.get("source", "")), r.get("uid", "")))
    sources.write()  # before the manifest: every number it holds is there
    for row in rows:
        row["cohort"] = identity.cohort
    ledger.finish(csv_text(MANIFEST_FIELDS, rows))
    back = {identity.pseudonyms[p] for p, outcome in outcomes.items() if outcome[0] == "imported"}  # (after a kill)
    withdrawn = [ledger.withdrawn[p] for p in sorted(ledger.withdrawn, key=pseudonym_number) if p not in back]
    warned = sum(outcome[0] == "imported" and bool(outcome[1]) for outcome in outcomes.values())
    apart = sum(bool(links.warnings) for links in patients)
    return CohortReport(run.out, counts, rows, lines, withdrawn, index.counts(), len(index.skipped_files), warned,
                        apart)


def _patient_rows(links: PatientLinks, pseudonym: str, split: str, outcome) -> list[dict[str, str]]:
    rows = []
    if not links.candidates and links.patient_id:
        rows.append({"pseudonym": pseudonym, "status": "skipped", "kind": "patient",
                     "reason": "no RT Plan of this patient in the archive"})
    for candidate in links.candidates:
        row = _plan_row(candidate, pseudonym, split if candidate is links.chosen else "")
        if candidate is links.chosen:
            status, reason, fingerprint, prescribed, missing = outcome
            if status == "imported":
                reason = "; ".join(["chosen", *([reason] if reason else [])])
            row.update(status=status, reason=reason, fingerprint=fingerprint, prescriptions_gy=prescribed,
                       missing_targets=" ".join(missing))
        elif candidate.reason:
            row.update(status="skipped", reason=candidate.reason)
        elif links.refusal:
            row.update(status="failed", reason=links.refusal)
        else:
            row.update(status="skipped", reason=f"older than the chosen {links.chosen.describe()}")
        if candidate.apart:
            row["reason"] += f"; {candidate.apart}"
        rows.append(row)
    for kind, modality, uid, why in links.left:
        rows.append({"pseudonym": pseudonym, "status": "skipped", "reason": why, "kind": kind, "modality": modality,
                     "uid": uid})
    return rows
