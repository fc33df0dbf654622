"""The plausible ceiling of a predicted dose: above it, a dose no plan gives.

A badly trained model can predict hundreds of Gy (860 Gy was seen for a 70 Gy site); a commissioned
model's verdict calls such a model unfit, but a single run has no verdict. Every path to a prediction
(``--predict-only``, ``openkbp-dicom predict``, the DICOM node) asks :func:`above_ceiling` of each
patient's dose and, when it is above, says so where its outputs are read: a warning in the log, the
scores (``scores.json``, ``dvh.json``), the node's journal and the RT Dose's comment. The ceiling is
the site's (:attr:`provided_code.sites.Site.dose_ceiling_gy`: 1.3 times its highest prescription
unless its file sets ``dose_ceiling_gy``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from provided_code.sites import Site


@dataclasses.dataclass(frozen=True)
class AboveCeiling:
    """A predicted dose above the site's plausible ceiling: its maximum, the ceiling, how many voxels
    are above it, and where the ceiling comes from (:attr:`~provided_code.sites.Site.dose_ceiling_said`)."""

    max_gy: float
    ceiling_gy: float
    voxels: int
    source: str

    def line(self) -> str:
        """The warning, in one line."""
        return (f"predicted dose above the plausible ceiling: {self.max_gy:.1f} Gy at most, over {self.ceiling_gy:g} "
                f"Gy in {self.voxels} voxel(s) (the ceiling: {self.source}); no plan gives such a dose: the model is "
                f"likely badly trained, check it before using its predictions")

    def comment(self) -> str:
        """What an RT Dose's Dose Comment says (a DICOM LO: at most 64 characters)."""
        return f"Above the plausible ceiling: {self.max_gy:.0f} Gy > {self.ceiling_gy:g} Gy"[:64]

    def short(self) -> str:
        """A few words for a journal's reason: ``above the plausible ceiling (860 Gy > 91 Gy)``."""
        return f"above the plausible ceiling ({self.max_gy:.0f} Gy > {self.ceiling_gy:g} Gy)"

    def to_dict(self) -> dict:
        return {"max_gy": self.max_gy, "ceiling_gy": self.ceiling_gy, "voxels": self.voxels, "source": self.source}


def above_ceiling(dose: np.ndarray, site: Site) -> AboveCeiling | None:
    """``dose`` (a patient's predicted dose, Gy, any grid) against ``site``'s plausible ceiling: an
    :class:`AboveCeiling` when some voxel is above it, else None."""
    dose = np.asarray(dose)
    ceiling = float(site.dose_ceiling_gy)
    top = float(dose.max()) if dose.size else 0.0
    if not top > ceiling:
        return None
    return AboveCeiling(round(top, 3), ceiling, int(np.count_nonzero(dose > ceiling)), site.dose_ceiling_said)
