"""A clinic's DICOM in and out: CT series, RTSTRUCT and RTDOSE to an OpenKBP patient folder, and a
predicted dose back to an RTDOSE (and NIfTI) on the CT's own grid.

Modules: ``errors`` (one error type naming file and problem), ``names`` (ROI names to the ten
OpenKBP structures), ``ct_series`` (the CT series), ``rtstruct`` (contours and their polygon fill),
``grid`` (the 128³ box inside the CT and the resampling between the two), ``rtdose`` (reading and
writing RT Dose), ``importer`` and ``exporter`` (the two directions), ``rtplan`` (a plan's prescriptions and beams),
``archive``, ``pseudonyms``, ``ledger`` and ``cohort`` (a clinic's archive to a training set). Everything here needs
``pydicom`` (the ``dicom`` extra); nothing imports TensorFlow.
"""
