"""An RT Plan: what was prescribed and from where it was delivered.

- Prescriptions: the TARGET items of ``DoseReferenceSequence`` with a ``TargetPrescriptionDose``,
  matched to the site's targets by the name of the ROI each references (``ReferencedROINumber`` in
  the structure set) or by its ``DoseReferenceDescription``, through the names table of
  :mod:`provided_code.dicom.names` (normalised names). A plan without such items gives its fraction
  group's total, the beams' doses per fraction times the fractions planned, to the site's highest
  target (a plan's nominal dose is its primary target's). Targets left unmatched keep the site's.
- Beams: each treatment beam of ``BeamSequence`` (setup beams left out): a static beam at its first
  control point's ``GantryAngle`` when the gantry does not turn (``GantryRotationDirection``
  ``NONE``), else an arc from the first control point's angle to the last's in that direction; the
  first control point's ``PatientSupportAngle`` is the couch (a non-zero couch is warned about: the
  beam channels model coplanar beams).
"""

from __future__ import annotations

import dataclasses
import os

from provided_code.dicom.errors import DicomInputError
from provided_code.sites import normalise_name

COUCH_TOLERANCE_DEGREES = 0.01  # planning systems write 8e-10 for a couch at zero


@dataclasses.dataclass(frozen=True)
class BeamRow:
    """One beam as ``beams.csv`` holds it (:mod:`provided_code.data.patient_plan`): a static beam
    (``gantry_stop`` and ``direction`` None) or an arc."""

    type: str  # "static" or "arc"
    gantry_start: float  # degrees
    gantry_stop: float | None = None  # arcs only
    direction: str | None = None  # "CW" or "CC"; arcs only
    couch: float = 0.0  # patient support angle, degrees

    def as_row(self) -> dict:
        """The row :func:`provided_code.data.patient_plan.write_beams` writes."""
        return {"type": self.type, "gantry_start": float(self.gantry_start),
                "gantry_stop": None if self.gantry_stop is None else float(self.gantry_stop),
                "direction": self.direction, "couch": float(self.couch)}


@dataclasses.dataclass(frozen=True)
class DoseReference:
    number: int | None
    description: str
    roi_number: int | None
    dose_gy: float  # TargetPrescriptionDose


@dataclasses.dataclass(frozen=True)
class PlanInfo:
    """What the cohort import needs of an RT Plan (no dataset kept: a cohort holds thousands)."""

    sop_instance_uid: str
    label: str
    approval: str  # ApprovalStatus: APPROVED, UNAPPROVED, REJECTED ('' when absent)
    date_time: str  # RTPlanDate + RTPlanTime (else the instance creation's), 'YYYYMMDDHHMMSS...' for ordering
    structure_set_uid: str  # ReferencedStructureSetSequence
    fractions: int | None  # the first fraction group's NumberOfFractionsPlanned
    dose_per_fraction_gy: float | None  # the sum of its beams' BeamDose
    dose_references: tuple[DoseReference, ...]
    beams: tuple[BeamRow, ...]
    beam_numbers: tuple[int, ...]  # the treatment beams, in BeamSequence order
    warnings: tuple[str, ...] = ()

    @property
    def total_dose_gy(self) -> float | None:
        """The fraction group's dose: per fraction times the fractions planned."""
        if self.fractions and self.dose_per_fraction_gy:
            return self.fractions * self.dose_per_fraction_gy
        return None


def _float(value) -> float | None:
    try:
        return None if value is None or value == "" else float(value)
    except (TypeError, ValueError):
        return None


def _int(value) -> int | None:
    number = _float(value)
    return None if number is None else int(number)


def read_plan(dataset, path: os.PathLike | str) -> PlanInfo:
    """The plan in an RT Plan ``dataset`` read from ``path`` (for the error messages)."""
    structure_sets = dataset.get("ReferencedStructureSetSequence") or []
    structure_set = str(structure_sets[0].get("ReferencedSOPInstanceUID", "")) if structure_sets else ""
    references = []
    for item in dataset.get("DoseReferenceSequence") or []:
        dose = _float(item.get("TargetPrescriptionDose"))
        if str(item.get("DoseReferenceType", "")).upper() != "TARGET" or dose is None or dose <= 0:
            continue
        references.append(DoseReference(_int(item.get("DoseReferenceNumber")),
                                        str(item.get("DoseReferenceDescription", "") or ""),
                                        _int(item.get("ReferencedROINumber")), dose))
    fractions, per_fraction, group_beams = None, None, None
    groups = dataset.get("FractionGroupSequence") or []
    if groups:
        group = groups[0]
        fractions = _int(group.get("NumberOfFractionsPlanned"))
        referenced = group.get("ReferencedBeamSequence") or []
        group_beams = {_int(item.get("ReferencedBeamNumber")) for item in referenced}
        doses = [_float(item.get("BeamDose")) for item in referenced]
        if doses and all(d is not None for d in doses):
            per_fraction = float(sum(doses))
    beams, numbers, warnings = [], [], []
    for beam in dataset.get("BeamSequence") or []:
        if str(beam.get("TreatmentDeliveryType", "TREATMENT")).upper() != "TREATMENT":
            continue  # setup fields
        number = _int(beam.get("BeamNumber"))
        if group_beams and number not in group_beams:
            continue  # a beam no fraction group delivers
        name = str(beam.get("BeamName", "") or number)
        points = beam.get("ControlPointSequence") or []
        angles = [_float(point.get("GantryAngle")) for point in points]
        angles = [a for a in angles if a is not None]
        if not angles:
            raise DicomInputError(path, f"beam {name!r} has no control point with a GantryAngle")
        directions = [str(point.get("GantryRotationDirection", "")).upper() for point in points]
        turning = next((d for d in directions if d in ("CW", "CC")), None)
        couch = _float(points[0].get("PatientSupportAngle")) or 0.0
        couch %= 360.0
        if min(couch, 360.0 - couch) < COUCH_TOLERANCE_DEGREES:
            couch = 0.0
        elif couch:
            warnings.append(f"beam {name!r} has couch angle {couch:g}°: a non-coplanar beam, recorded, while the "
                            f"beam channels model it as coplanar")
        if turning is None or len(set(angles)) == 1:
            beams.append(BeamRow("static", angles[0] % 360.0, couch=couch))
        else:
            beams.append(BeamRow("arc", angles[0] % 360.0, angles[-1] % 360.0, turning, couch))
        numbers.append(number)
    date = str(dataset.get("RTPlanDate", "") or dataset.get("InstanceCreationDate", "") or "")
    time = str(dataset.get("RTPlanTime", "") or dataset.get("InstanceCreationTime", "") or "")
    return PlanInfo(
        sop_instance_uid=str(dataset.get("SOPInstanceUID", "")),
        label=str(dataset.get("RTPlanLabel", "") or dataset.get("RTPlanName", "") or ""),
        approval=str(dataset.get("ApprovalStatus", "") or "").upper(),
        date_time=date + time,
        structure_set_uid=structure_set,
        fractions=fractions,
        dose_per_fraction_gy=per_fraction,
        dose_references=tuple(references),
        beams=tuple(beams),
        beam_numbers=tuple(numbers),
        warnings=tuple(warnings),
    )


def plan_prescriptions(plan: PlanInfo, site_targets: dict[str, float], table: dict[str, tuple[str, ...]],
                       roi_names: dict[int, str]) -> tuple[dict[str, float], list[str]]:
    """Each site target's prescription (Gy) from the plan where it says one, else the site's; and
    lines saying where each came from. ``table``: structure -> DICOM names (a target the table does
    not list is matched by its own name); ``roi_names``: the structure set's ROI number -> name."""
    names = {target: {normalise_name(n) for n in table.get(target, ())} | {normalise_name(target)} for target in site_targets}
    found: dict[str, tuple[float, str]] = {}
    unmatched = []
    for reference in plan.dose_references:
        candidates = [roi_names[reference.roi_number]] if reference.roi_number in roi_names else []
        candidates.append(reference.description)
        target = next((t for c in candidates if c for t in site_targets if normalise_name(c) in names[t]), None)
        if target is None:
            unmatched.append(f"{reference.description or reference.number!r} {reference.dose_gy:g} Gy")
            continue
        if target not in found or reference.dose_gy > found[target][0]:  # two for one target: the higher
            found[target] = (reference.dose_gy, f"dose reference {candidates[0]!r}")
    lines = []
    if not plan.dose_references and plan.total_dose_gy and site_targets:
        highest = max(site_targets, key=site_targets.get)
        found[highest] = (round(plan.total_dose_gy, 6), f"fraction group: {plan.fractions} × "
                                                         f"{plan.dose_per_fraction_gy:g} Gy")
    if unmatched:
        lines.append(f"dose references matching no target of the site: {', '.join(unmatched)}")
    prescriptions = {}
    for target, default in site_targets.items():
        if target in found:
            prescriptions[target] = found[target][0]
            lines.append(f"{target}: {found[target][0]:g} Gy ({found[target][1]})")
        else:
            prescriptions[target] = default
            lines.append(f"{target}: {default:g} Gy (the site's; the plan names none)")
    return prescriptions, lines
