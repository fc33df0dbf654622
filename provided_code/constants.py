"""Facts of the OpenKBP file format, fixed once and used everywhere. What a treatment site decides
(its structures, prescriptions, mirror pairs, names and beams) is the site's: :mod:`provided_code.sites`.

Volumes are ``(128, 128, 128)`` arrays indexed by the flat C-order index of the CSV files. In the
OpenKBP data, axis 0 runs anterior to posterior, axis 1 from the patient's right to left and axis
2 superior to inferior (the slice axis); ``voxel_dimensions`` gives the spacing of the three axes
in mm, in the same order.
"""

VOLUME_SHAPE = (128, 128, 128)
NUM_VOXELS = VOLUME_SHAPE[0] * VOLUME_SHAPE[1] * VOLUME_SHAPE[2]

CT_MAX = 4095  # CT grey values are clipped to [0, CT_MAX], as the challenge recommends.
CT_HU_OFFSET = 1000.0  # a CT grey value is HU + this: OpenKBP's air sits at 0, fat near 908, soft tissue near 1045
LEFT_RIGHT_AXIS = 1  # spatial axis that runs from the patient's right to left

# File names inside a patient folder.
CT_FILE = "ct.csv"
DOSE_FILE = "dose.csv"
POSSIBLE_DOSE_MASK_FILE = "possible_dose_mask.csv"
VOXEL_DIMENSIONS_FILE = "voxel_dimensions.csv"
PRESCRIPTIONS_FILE = "prescriptions.csv"  # a patient's own plan, each optional (provided_code/data/patient_plan.py)
BEAMS_FILE = "beams.csv"
# Every file of a patient folder but its structures' (one <structure name>.csv per contoured structure).
PATIENT_FILES = (CT_FILE, DOSE_FILE, POSSIBLE_DOSE_MASK_FILE, VOXEL_DIMENSIONS_FILE, PRESCRIPTIONS_FILE, BEAMS_FILE)

