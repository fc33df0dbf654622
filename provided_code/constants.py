"""Facts of the OpenKBP format, fixed once and used everywhere.

Volumes are ``(128, 128, 128)`` arrays indexed by the flat C-order index of the CSV files. In the
OpenKBP data, axis 0 runs anterior to posterior, axis 1 from the patient's right to left and axis
2 superior to inferior (the slice axis); ``voxel_dimensions`` gives the spacing of the three axes
in mm, in the same order.
"""

import numpy as np

VOLUME_SHAPE = (128, 128, 128)
NUM_VOXELS = VOLUME_SHAPE[0] * VOLUME_SHAPE[1] * VOLUME_SHAPE[2]

OARS = ("Brainstem", "SpinalCord", "RightParotid", "LeftParotid", "Esophagus", "Larynx", "Mandible")
TARGETS = ("PTV56", "PTV63", "PTV70")
# The challenge's channel order: bit k of a packed ``structure_masks`` volume is STRUCTURES[k].
STRUCTURES = OARS + TARGETS
# The two bits a left-right mirror swaps in a packed ``structure_masks`` volume.
RIGHT_PAROTID_BIT = 1 << STRUCTURES.index("RightParotid")
LEFT_PAROTID_BIT = 1 << STRUCTURES.index("LeftParotid")
TARGET_BITS = sum(1 << STRUCTURES.index(name) for name in TARGETS)  # a voxel in any PTV has one of these
PRESCRIPTIONS_GY = {"PTV56": 56.0, "PTV63": 63.0, "PTV70": 70.0}
# The gantry angle of the first of OpenKBP's nine beams (the others every 40°), read off the
# training doses by scripts/beam_angles.py (README, "Beam geometry").
BEAM_PHASE_DEGREES = 0.0

CT_MAX = 4095  # CT grey values are clipped to [0, CT_MAX], as the challenge recommends.
LEFT_RIGHT_AXIS = 1  # spatial axis that runs from the patient's right to left

# File names inside a patient folder.
CT_FILE = "ct.csv"
DOSE_FILE = "dose.csv"
POSSIBLE_DOSE_MASK_FILE = "possible_dose_mask.csv"
VOXEL_DIMENSIONS_FILE = "voxel_dimensions.csv"


def structures_of_patterns() -> np.ndarray:
    """``(1024, 10)`` 0/1: row p says which structures a voxel whose packed bits are p is in."""
    return (np.arange(2 ** len(STRUCTURES))[:, None] >> np.arange(len(STRUCTURES))) & 1
