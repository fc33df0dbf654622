"""A clinic's DICOM archive (a PACS or planning-system export): every object's header indexed, the
objects linked by their references, and one plan chosen per patient.

- Scanning (:func:`scan_archive`): every file under the folder, nested to any depth, whatever its
  name, with or without an extension; headers only (neither pixels nor a structure set's contours
  are read), in a pool of threads. A DICOMDIR and files that are not DICOM are skipped and listed;
  an object found twice (the same SOP Instance UID) is read once.
- Linking (:func:`link_patients`): RT Dose -> RT Plan (``ReferencedRTPlanSequence``) -> RT
  Structure Set (``ReferencedStructureSetSequence``) -> CT series (the series the structure set
  names in ``RTReferencedSeriesSequence``, else the one CT series of its frame of reference).
  Other series (MR, a CBCT or another CT) and objects are listed and left.
- The plan of each patient: approved (``ApprovalStatus`` APPROVED) with a whole-plan dose (an RT
  Dose of ``DoseSummationType`` PLAN; else one BEAM dose for each of its beams, summed; else a
  FRACTION dose times the fractions planned, DICOM's FRACTION taken as one fraction's dose), its
  structure set and CT series in the archive; among several, the newest (``RTPlanDate`` and
  ``RTPlanTime``, else the instance's creation); two equally new are refused for that patient,
  naming both. The objects of a patient are those of one PatientID; an ID whose objects name
  different patients (their names, birth dates or sexes differ: two patients exported as
  ``ANON``), or an empty one, is refused rather than merged into one patient. A plan set aside on
  a CT that shares neither the study nor the frame of reference of the chosen plan's is warned
  about (``PatientLinks.warnings``, ``Candidate.apart``): two patients an anonymiser left nothing
  else to tell apart, or a new planning CT.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import logging
import os
from pathlib import Path

from provided_code.dicom.files import read_dataset
from provided_code.dicom.rtplan import PlanInfo, read_plan
from provided_code.dicom.rtstruct import structure_set_references
from provided_code.infra.progress import Progress, no_progress

logger = logging.getLogger(__name__)

IMAGE_MODALITIES = ("CT", "MR", "PT", "NM", "US", "CR", "DX", "MG", "RTIMAGE", "OT", "SC", "XA")
DEFAULT_WORKERS = 8  # header reads wait on the disk more than on the processor


@dataclasses.dataclass(frozen=True)
class DicomObject:
    """One DICOM file's header, as the linking needs it."""

    path: Path
    size: int
    mtime_ns: int
    modality: str
    sop_class_uid: str
    sop_instance_uid: str
    series_instance_uid: str
    patient_id: str
    frame_of_reference_uid: str
    date_time: str = ""  # content (or creation) date and time, for ordering
    # who the PatientID is: digests of the normalised PatientName and PatientBirthDate, and PatientSex ('' where
    # absent), to tell two patients under one ID apart without keeping their names
    person: tuple[str, str, str] = ("", "", "")
    study_instance_uid: str = ""
    # RT Dose
    summation: str = ""  # DoseSummationType
    plan_uid: str = ""  # ReferencedRTPlanSequence
    beam_numbers: tuple[int, ...] = ()  # the beams a BEAM dose is of
    # RT Structure Set
    referenced_series: tuple[str, ...] = ()
    roi_names: tuple[tuple[int, str], ...] = ()  # (ROINumber, ROIName)
    label: str = ""
    # RT Plan
    plan: PlanInfo | None = None

    @property
    def fingerprint(self) -> tuple[str, int, int]:
        return self.sop_instance_uid, self.size, self.mtime_ns


@dataclasses.dataclass
class ArchiveIndex:
    root: Path
    objects: list[DicomObject]
    skipped_files: list[tuple[Path, str]]  # (path, why): DICOMDIR, not DICOM, unreadable, duplicate
    duplicate_of: dict[Path, Path] = dataclasses.field(default_factory=dict)  # a skipped copy -> the file read

    def owners(self) -> dict[str, str]:
        """The UID of every object and image series -> the PatientID it is under."""
        owners = {item.series_instance_uid: item.patient_id for item in self.objects
                  if item.modality in IMAGE_MODALITIES and item.series_instance_uid}
        owners.update({item.sop_instance_uid: item.patient_id for item in self.objects if item.sop_instance_uid})
        return owners

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for item in self.objects:
            counts[item.modality] = counts.get(item.modality, 0) + 1
        return counts


def _text(value) -> str:
    return "" if value is None else str(value).strip()


def _first(sequence):
    return sequence[0] if sequence else None


def _name_key(name) -> str:
    """A PatientName as compared between the objects of one PatientID: its family and given names
    (systems differ in the middle name, prefix and suffix they keep), upper case, spaces collapsed."""
    parts = [" ".join(part.split()).upper() for part in _text(name).split("=")[0].split("^")[:2]]
    return "^".join(parts).strip("^")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""


def _date_time(header, *pairs) -> str:
    for date, time in pairs:
        if _text(header.get(date)):
            return _text(header.get(date)) + _text(header.get(time))
    return ""


def _read_header(path: Path) -> tuple[DicomObject | None, str]:
    """The object of one file, or None and why it was skipped."""
    try:
        stat = path.stat()
    except OSError as error:
        return None, f"unreadable ({error.strerror or error})"
    if path.name.upper() == "DICOMDIR":
        return None, "DICOMDIR (a media directory, not an object)"
    try:
        header = read_dataset(path, stop_before_pixels=True, stop_before_contours=True)
    except Exception as error:  # noqa: BLE001 - a damaged file is a skipped file, whatever pydicom raises
        return None, f"unreadable DICOM ({type(error).__name__}: {' '.join(str(error).split())})"
    if header is None:
        return None, "not DICOM"
    from pydicom.uid import MediaStorageDirectoryStorage  # (pydicom is there: it read the header)

    meta = getattr(header, "file_meta", None)
    sop_class = _text(header.get("SOPClassUID")) or _text(meta.get("MediaStorageSOPClassUID") if meta else "")
    if sop_class == MediaStorageDirectoryStorage or "DirectoryRecordSequence" in header:
        return None, "DICOMDIR (a media directory, not an object)"
    modality = _text(header.get("Modality")).upper()
    if not modality and not _text(header.get("SOPInstanceUID")):  # a file header and no data set behind it
        return None, "a DICOM file header without a data set (no Modality, no SOP Instance UID): damaged or cut short"
    fields = dict(path=path, size=stat.st_size, mtime_ns=stat.st_mtime_ns, modality=modality or "?",
                  sop_class_uid=sop_class, sop_instance_uid=_text(header.get("SOPInstanceUID")),
                  series_instance_uid=_text(header.get("SeriesInstanceUID")),
                  patient_id=_text(header.get("PatientID")),
                  person=(_digest(_name_key(header.get("PatientName"))), _digest(_text(header.get("PatientBirthDate"))),
                          _text(header.get("PatientSex")).upper()),
                  study_instance_uid=_text(header.get("StudyInstanceUID")),
                  frame_of_reference_uid=_text(header.get("FrameOfReferenceUID")),
                  date_time=_date_time(header, ("ContentDate", "ContentTime"),
                                       ("InstanceCreationDate", "InstanceCreationTime")))
    try:
        if modality == "RTDOSE":
            plan = _first(header.get("ReferencedRTPlanSequence"))
            beams = []
            for group in (plan.get("ReferencedFractionGroupSequence") or []) if plan else []:
                beams += [int(b.ReferencedBeamNumber) for b in group.get("ReferencedBeamSequence") or []
                          if b.get("ReferencedBeamNumber") is not None]
            fields.update(summation=_text(header.get("DoseSummationType")).upper(),
                          plan_uid=_text(plan.get("ReferencedSOPInstanceUID")) if plan else "",
                          beam_numbers=tuple(beams))
        elif modality == "RTSTRUCT":
            references = structure_set_references(header)  # (read without its contours)
            fields["frame_of_reference_uid"] = fields["frame_of_reference_uid"] or references.frame_uid
            fields.update(referenced_series=references.series_uids,
                          roi_names=tuple((int(roi.ROINumber), _text(roi.get("ROIName")))
                                          for roi in header.get("StructureSetROISequence") or []
                                          if roi.get("ROINumber") is not None),
                          label=_text(header.get("StructureSetLabel")),
                          date_time=_date_time(header, ("StructureSetDate", "StructureSetTime"),
                                               ("InstanceCreationDate", "InstanceCreationTime")))
        elif modality == "RTPLAN":
            fields.update(plan=read_plan(header, path))
    except Exception as error:  # noqa: BLE001 - a malformed reference makes the file unusable, not the scan
        return None, f"malformed {modality} ({type(error).__name__}: {' '.join(str(error).split())})"
    return DicomObject(**fields), ""


def list_files(root: os.PathLike | str) -> list[Path]:
    """Every regular file under ``root``, in a stable order (sorted folder by folder)."""
    files = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        files += [Path(folder) / name for name in sorted(names) if os.path.isfile(os.path.join(folder, name))]
    return files


def scan_archive(root: os.PathLike | str, progress: Progress = no_progress,
                 workers: int | None = None) -> ArchiveIndex:
    """Every DICOM object's header under ``root`` (see the module docstring)."""
    root = Path(root)
    files = list_files(root)
    objects, skipped, seen, duplicate_of = [], [], {}, {}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers or DEFAULT_WORKERS)
    try:
        for path, (item, why) in progress(zip(files, pool.map(_read_header, files)), len(files), "Reading headers"):
            if item is None:
                skipped.append((path, why))
            elif item.sop_instance_uid and item.sop_instance_uid in seen:
                duplicate_of[path] = seen[item.sop_instance_uid]
                skipped.append((path, f"duplicate of {seen[item.sop_instance_uid].relative_to(root)} "
                                      f"(SOP Instance UID {item.sop_instance_uid})"))
            else:
                seen[item.sop_instance_uid] = path
                objects.append(item)
    finally:  # an error or Ctrl-C: the files not yet read are not read (a `with` block would read them all first)
        pool.shutdown(wait=True, cancel_futures=True)
    logger.info("Scanned %d files under %s: %d DICOM objects, %d skipped", len(files), root, len(objects), len(skipped))
    return ArchiveIndex(root, objects, skipped, duplicate_of)


@dataclasses.dataclass
class Candidate:
    """One RT Plan of a patient, with what it links to and why it cannot be used (``reason``)."""

    plan: DicomObject
    structure_set: DicomObject | None = None
    ct_files: list[DicomObject] = dataclasses.field(default_factory=list)
    ct_series_uid: str = ""
    doses: list[DicomObject] = dataclasses.field(default_factory=list)
    dose_scale: float = 1.0
    dose_summation: str = ""  # PLAN, BEAM (summed), FRACTION (× fractions)
    reason: str = ""  # empty: usable
    # set aside beside a chosen plan whose CT shares neither its study nor its frame of reference: why that matters
    apart: str = ""

    @property
    def info(self) -> PlanInfo:
        return self.plan.plan

    def describe(self) -> str:
        return f"plan {self.info.label!r} ({self.info.sop_instance_uid})"

    def sources(self) -> list[DicomObject]:
        return [self.plan, *([self.structure_set] if self.structure_set else []), *self.doses, *self.ct_files]

    def images(self) -> tuple[str, str]:
        """(study, frame of reference) of the CT the plan was made on: its CT series', else its
        structure set's, else its own."""
        image = (self.ct_files or [self.structure_set or self.plan])[0]
        return image.study_instance_uid, image.frame_of_reference_uid


@dataclasses.dataclass
class PatientLinks:
    patient_id: str
    candidates: list[Candidate]
    chosen: Candidate | None
    refusal: str  # why no plan was chosen (empty when one was, or when there is no usable plan)
    left: list[tuple[str, str, str, str]]  # (kind, modality, uid, reason) of series and objects not used
    # what the linking warns of for the chosen plan: plans set aside on a CT of another study and frame of reference
    warnings: list[str] = dataclasses.field(default_factory=list)


def _choose_dose(plan: PlanInfo, doses: list[DicomObject]) -> tuple[list[DicomObject], float, str, str]:
    """(doses, scale, summation, reason): the plan's whole-plan dose (see the module docstring)."""
    by_kind: dict[str, list[DicomObject]] = {}
    for dose in doses:
        by_kind.setdefault(dose.summation or "PLAN", []).append(dose)
    if "PLAN" in by_kind:
        plan_doses = sorted(by_kind["PLAN"], key=lambda d: d.date_time, reverse=True)
        if len(plan_doses) > 1 and plan_doses[0].date_time == plan_doses[1].date_time:
            return [], 1.0, "", (f"two PLAN doses, equally new: {plan_doses[0].sop_instance_uid} and "
                                 f"{plan_doses[1].sop_instance_uid}")
        return plan_doses[:1], 1.0, "PLAN", ""
    if "BEAM" in by_kind:
        beam_doses = by_kind["BEAM"]
        numbers = [n for d in beam_doses for n in d.beam_numbers]
        wanted = set(plan.beam_numbers)
        if numbers and len(numbers) == len(set(numbers)) and set(numbers) == wanted:
            return sorted(beam_doses, key=lambda d: d.beam_numbers), 1.0, "BEAM", ""
        if not numbers and len(beam_doses) == len(wanted):
            return beam_doses, 1.0, "BEAM", ""
        return [], 1.0, "", (f"BEAM doses for beams {sorted(numbers) or len(beam_doses)} do not cover the plan's "
                             f"beams {sorted(wanted)} once each")
    if "FRACTION" in by_kind:
        if len(by_kind["FRACTION"]) > 1:
            return [], 1.0, "", f"{len(by_kind['FRACTION'])} FRACTION doses"
        if not plan.fractions:
            return [], 1.0, "", "a FRACTION dose, and the plan gives no NumberOfFractionsPlanned"
        return by_kind["FRACTION"], float(plan.fractions), "FRACTION", ""
    if doses:
        kinds = ", ".join(sorted(by_kind))
        return [], 1.0, "", f"no whole-plan dose (DoseSummationType {kinds})"
    return [], 1.0, "", "no RT Dose references this plan"


def link_patients(index: ArchiveIndex) -> list[PatientLinks]:
    """Each patient's plans linked to their doses, structure set and CT series, and the one chosen
    (see the module docstring); patients in the order of their PatientID."""
    by_patient: dict[str, list[DicomObject]] = {}
    for item in index.objects:
        by_patient.setdefault(item.patient_id, []).append(item)
    return [_link_one(patient_id, by_patient[patient_id]) for patient_id in sorted(by_patient)]


def _link_one(patient_id: str, objects: list[DicomObject]) -> PatientLinks:
    plans = [o for o in objects if o.modality == "RTPLAN"]
    structure_sets = {o.sop_instance_uid: o for o in objects if o.modality == "RTSTRUCT"}
    doses_by_plan: dict[str, list[DicomObject]] = {}
    for dose in (o for o in objects if o.modality == "RTDOSE"):
        doses_by_plan.setdefault(dose.plan_uid, []).append(dose)
    series: dict[str, list[DicomObject]] = {}
    for item in objects:
        if item.modality in IMAGE_MODALITIES:
            series.setdefault(item.series_instance_uid, []).append(item)
    ct_series = {uid: files for uid, files in series.items() if files[0].modality == "CT"}

    candidates = []
    for plan_object in sorted(plans, key=lambda o: (o.plan.date_time, o.sop_instance_uid)):
        candidate = Candidate(plan_object)
        plan = plan_object.plan
        doses, scale, summation, dose_reason = _choose_dose(plan, doses_by_plan.get(plan.sop_instance_uid, []))
        candidate.doses, candidate.dose_scale, candidate.dose_summation = doses, scale, summation
        structure_set = structure_sets.get(plan.structure_set_uid)
        candidate.structure_set = structure_set
        reasons = []
        if plan.approval != "APPROVED":
            reasons.append(f"not approved (ApprovalStatus {plan.approval or 'absent'})")
        if dose_reason:
            reasons.append(dose_reason)
        if structure_set is None:
            reasons.append(f"its structure set {plan.structure_set_uid or '(none referenced)'} is not in the archive")
        else:
            uid, why = _ct_of(structure_set, ct_series)
            candidate.ct_series_uid = uid
            candidate.ct_files = ct_series.get(uid, [])
            if why:
                reasons.append(why)
        candidate.reason = "; ".join(reasons)
        candidates.append(candidate)

    usable = [c for c in candidates if not c.reason]
    chosen, refusal = None, _shared_id(patient_id, objects) if usable else ""
    if usable and not refusal:
        newest = max(c.info.date_time for c in usable)
        tied = [c for c in usable if c.info.date_time == newest]
        if len(tied) > 1:
            refusal = (f"{len(tied)} approved plans with a whole-plan dose, equally new "
                       f"({newest or 'no date'}): " + " and ".join(c.describe() for c in tied))
        else:
            chosen = tied[0]
    warnings = _apart_from(chosen, candidates) if chosen else []
    used = {id(o) for c in ([chosen] if chosen else []) for o in c.sources()}
    referenced_plans = {p.sop_instance_uid for p in plans}
    left = []
    for uid, files in sorted(series.items()):
        if any(id(f) in used for f in files):
            continue
        modality = files[0].modality
        if modality == "CT":
            why = (f"CT series of {len(files)} images not referenced by the chosen plan's structure set "
                   f"(a CBCT or another CT)" if chosen else f"CT series of {len(files)} images; no plan chosen")
        else:
            why = f"{modality} series of {len(files)} images: not a planning CT"
        left.append(("series", modality, uid, why))
    for item in sorted(objects, key=lambda o: (o.modality, o.sop_instance_uid)):
        if id(item) in used or item.modality in IMAGE_MODALITIES or item.modality == "RTPLAN":
            continue
        if item.modality == "RTDOSE" and item.plan_uid in referenced_plans:
            continue  # listed with its plan's row
        if item.modality == "RTDOSE":
            why = (f"RT Dose referencing plan {item.plan_uid}, not in the archive" if item.plan_uid
                   else "RT Dose referencing no RT Plan")
        elif item.modality == "RTSTRUCT":
            why = "RT Structure Set not used by the chosen plan" if chosen else "RT Structure Set; no plan chosen"
        else:
            why = f"{item.modality} object: not used"
        left.append(("object", item.modality, item.sop_instance_uid, why))
    return PatientLinks(patient_id, candidates, chosen, refusal, left, warnings)


def _apart_from(chosen: Candidate, candidates: list[Candidate]) -> list[str]:
    """The plans set aside beside ``chosen`` whose CT shares neither its study nor its frame of
    reference (each candidate's ``apart`` says so): another patient under the same PatientID, as an
    anonymiser exports two (``ANONYMOUS``, no birth date), or the patient's new planning CT. A
    warning each, for the physicist to tell which."""
    study, frame = chosen.images()
    warnings = []
    for candidate in candidates:
        other_study, other_frame = candidate.images()
        shared = (study and other_study == study) or (frame and other_frame == frame)
        if candidate is chosen or shared or not (other_study or other_frame):
            continue
        candidate.apart = (f"its CT shares neither the study nor the frame of reference of the chosen "
                           f"{chosen.describe()}'s: another patient under this PatientID (an anonymised export?) or "
                           f"a new planning CT")
        warnings.append(f"{candidate.describe()}, set aside, is on a CT of another study and frame of reference: "
                        f"another patient under this PatientID (an anonymised export? give each patient an ID of its "
                        f"own) or a new planning CT")
    return warnings


_DEFINITE_SEXES = frozenset({"M", "F"})  # PatientSex values that tell two patients apart


def _shared_id(patient_id: str, objects: list[DicomObject]) -> str:
    """Why the objects under one PatientID cannot be taken as one patient's: no PatientID, or
    several patient names or birth dates under it, or an M and an F (two patients exported as
    ``ANON``); '' when they can. Only a definite M against a definite F tells patients apart by sex:
    an O, another value or none is what one patient's objects may well say beside an M or F."""
    if not patient_id:
        return "no PatientID: objects without one cannot be told apart as patients; export them with their IDs"
    values = {"names": {o.person[0] for o in objects if o.person[0]},
              "birth dates": {o.person[1] for o in objects if o.person[1]},
              "sexes": {o.person[2] for o in objects if o.person[2] in _DEFINITE_SEXES}}
    differ = [what for what, found in values.items() if len(found) > 1]
    if differ:
        listed = " and ".join([", ".join(differ[:-1]), differ[-1]] if len(differ) > 1 else differ)
        return (f"one PatientID for {max(len(found) for found in values.values())} patients of different {listed}; "
                f"none of them is imported: export each with an ID of its own")
    return ""


def _ct_of(structure_set: DicomObject, ct_series: dict[str, list[DicomObject]]) -> tuple[str, str]:
    """The CT series a structure set was drawn on: (series UID, why not usable)."""
    named = [uid for uid in structure_set.referenced_series if uid in ct_series]
    if named:
        uid = named[0]
    elif structure_set.referenced_series:
        return "", f"CT series {structure_set.referenced_series[0]} of its structure set is not in the archive"
    else:
        same_frame = [uid for uid, files in ct_series.items()
                      if files[0].frame_of_reference_uid == structure_set.frame_of_reference_uid]
        if len(same_frame) != 1:
            return "", (f"its structure set names no CT series, and {len(same_frame)} CT series share its frame of "
                        f"reference {structure_set.frame_of_reference_uid}")
        uid = same_frame[0]
    frame = ct_series[uid][0].frame_of_reference_uid
    if frame != structure_set.frame_of_reference_uid:
        return uid, (f"CT series {uid} is in frame of reference {frame}, its structure set in "
                     f"{structure_set.frame_of_reference_uid}")
    return uid, ""
