"""What a user runs, apart from the machinery it runs on.

Beside ``training`` (none of them imports it, nor it them): ``predict`` (``--predict-only``: a
trained model's predictions for a stage, written and scored), ``score_folder`` (``openkbp-score``'s
folder work) and ``clinic`` (``openkbp-dicom predict``). Above the clinic's path, ``node``
(``openkbp-dicom serve``: a DICOM node around it). Above them, the command lines, the only
modules that print: ``cli`` (``openkbp-train``, ``runpod_train.py``, ``openkbp-score``),
``dicom_cli`` (``openkbp-dicom``) and ``demo``.
"""
