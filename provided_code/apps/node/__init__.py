"""``openkbp-dicom serve``: a DICOM node beside the planning system. It receives a patient's CT
series and structure set by C-STORE, predicts the dose once the series is complete, writes the RT
Dose (with the NIfTI and the DVH table) into its store and sends the RT Dose back by C-STORE.

Modules: ``store`` (UIDs checked before they name a file; objects written whole), ``journal``
(the SQLite record of every object, patient state and send attempt), ``readiness`` (which CT
images a structure set needs, and whether they are all here), ``sender`` (C-STORE to the
planning system, with back-off), ``predictor`` (the model, loaded once), ``server`` (the
Storage SCP and the threads around it). Needs ``pydicom`` and ``pynetdicom`` (the ``dicom``
extra); only ``predictor`` imports TensorFlow.
"""
