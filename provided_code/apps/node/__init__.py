"""``openkbp-dicom serve``: a DICOM node beside the planning system. It receives a patient's CT
series and structure set by C-STORE, predicts the dose once the series is complete, writes the RT
Dose (with the NIfTI and the DVH table) into its store and sends the RT Dose back by C-STORE.

Modules: ``server`` (the transport: the Storage SCP, its connection and association limits, and
the ``Node`` wiring the others), ``reactor`` (pynetdicom's association threads, waiting on the
socket rather than polling), ``intake`` (the checks each C-STORE passes, plain functions),
``store`` (UIDs checked before they name a file; objects written whole, owner-only), ``journal``
(the SQLite record of every object, refusal, patient state and send attempt), ``readiness`` (which
CT images a structure set needs, and whether they are all here), ``patients`` (the patients' state
machine and the prediction worker), ``send_queue`` (the RT Doses waiting to go, with back-off),
``sender`` (one C-STORE to the planning system), ``predictor`` (the model, loaded once, its folder
locked), ``text`` (what is logged of what the network sent: one line). Needs ``pydicom`` and
``pynetdicom`` (the ``dicom`` extra); only ``predictor`` imports TensorFlow.
"""
