"""When a patient is ready: a structure set together with every CT image of the series it was
drawn on.

A structure set names its images in ``ReferencedFrameOfReferenceSequence > RTReferencedStudySequence
> RTReferencedSeriesSequence > ContourImageSequence`` (and per contour in ``ContourImageSequence``).
When it names none, the CT series of its frame of reference stands in (if exactly one has arrived).
As long as an association that delivered objects of the patient is open, more may come (the
clinic's RT Dose, say): the patient waits for it to close, or for the completion timeout.
"""

from __future__ import annotations

import dataclasses

from provided_code.dicom.rtstruct import References, structure_set_references as read_references

READY, WAIT, FAIL = "ready", "wait", "fail"


def structure_set_references(dataset) -> References:
    """The frame of reference, image series and images an RTSTRUCT dataset names
    (:func:`provided_code.dicom.rtstruct.structure_set_references`). Raises ``ValueError`` (one
    line) when it names no frame of reference at all."""
    references = read_references(dataset)
    if not references.frame_uid:
        raise ValueError("the structure set names no frame of reference")
    return references


@dataclasses.dataclass(frozen=True)
class SeriesStatus:
    """How far the CT series of a structure set has arrived."""

    series_uid: str  # the CT series to predict on ('' while unknown)
    expected: int  # images the structure set names (0: it names none)
    present: int  # of those, how many are here
    slices: int  # CT images of ``series_uid`` here
    last_received: float  # time of the newest object of the patient (structure set or CT)
    problem: str = ""  # a reason to fail now, whatever arrives later
    refused: tuple[str, ...] = ()  # its objects refused (and not received since), each described

    @property
    def complete(self) -> bool:
        return not self.problem and bool(self.series_uid) and self.slices >= 2 and self.present == self.expected

    def describe(self) -> str:
        """What is missing, for a failure reason (and what of it was refused)."""
        if self.expected:
            here = f" (series {self.series_uid}: {self.slices} images here)" if self.series_uid else ""
            missing = f"{self.present} of the {self.expected} CT images it names arrived{here}"
        elif not self.series_uid:
            missing = "no CT series of its frame of reference arrived"
        else:
            missing = f"series {self.series_uid} has {self.slices} CT image(s)"
        if not self.refused:
            return missing
        shown = "; ".join(self.refused[:3]) + (f"; and {len(self.refused) - 3} more" if len(self.refused) > 3 else "")
        return f"{missing}; {len(self.refused)} refused: {shown}"


def decide(status: SeriesStatus, now: float, timeout: float, busy: bool) -> tuple[str, str]:
    """``(READY | WAIT | FAIL, reason)`` for a patient still receiving. ``busy``: an open association
    has delivered objects of the patient; ``timeout``: seconds without a new object of the patient
    before an incomplete one fails (and a complete one stops waiting for its association)."""
    if status.problem:
        return FAIL, status.problem
    quiet = now - status.last_received
    if status.complete and (not busy or quiet >= timeout):
        return READY, ""
    if quiet >= timeout and not status.complete:
        return FAIL, f"incomplete after {timeout:g} s without a new object: {status.describe()}"
    return WAIT, ""
