"""The plausible ceiling of a predicted dose (provided_code.metrics.ceiling): above it, a warning."""

import numpy as np

from provided_code.metrics.ceiling import AboveCeiling, above_ceiling
from provided_code.sites import openkbp


def test_a_dose_above_the_sites_ceiling_is_found_with_its_maximum_and_voxels():
    dose = np.zeros((4, 4, 4), np.float32)
    dose[0, 0, :2] = 860.0
    dose[1, 1, 1] = 90.0  # under OpenKBP's 91 Gy (1.3 × 70)
    found = above_ceiling(dose, openkbp())
    assert found == AboveCeiling(860.0, 91.0, 2, "1.3 × the site openkbp's highest prescription, 70 Gy")
    assert found.comment() == "Above the plausible ceiling: 860 Gy > 91 Gy" and len(found.comment()) <= 64
    assert found.line().startswith("predicted dose above the plausible ceiling: 860.0 Gy at most, over 91 Gy in 2 "
                                   "voxel(s) (the ceiling: 1.3 × the site openkbp's highest prescription, 70 Gy)")
    assert AboveCeiling(**found.to_dict()) == found  # as dvh.json and the journal keep it


def test_a_dose_up_to_the_ceiling_is_plausible():
    dose = np.full((4, 4, 4), 91.0, np.float32)
    assert above_ceiling(dose, openkbp()) is None and above_ceiling(np.zeros(0), openkbp()) is None
