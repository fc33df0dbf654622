"""Fast OpenKBP dose-prediction training.

The layers, lowest first (``tests/test_architecture.py`` keeps imports running downwards):

- ``infra`` (files written whole, TensorFlow's process settings, the progress hook, the folder
  lock, the checks before TensorFlow loads), ``constants``, ``errors``: nothing of dose prediction.
- ``config`` (the one run configuration, saved as JSON) and ``presets``; ``data`` (CSV I/O, the
  HDF5 cache, stacked arrays, phantoms, augmentation draws), ``networks`` (the U-Net builder),
  ``losses``, ``metrics`` (the challenge's dose and DVH scores), ``dicom`` (a clinic's CT,
  RTSTRUCT and RTDOSE in, an RT Dose out; the ``dicom`` extra).
- ``inference`` (a model's doses at 128³), ``plots``, ``run_folder`` (``results/<model-name>/``:
  its layout, and loading the model trained there).
- ``training`` (the step, the loop, callbacks and measures, the run itself), and beside it, importing
  none of it, ``apps.predict`` (``--predict-only``), ``apps.score_folder`` and ``apps.clinic``
  (``openkbp-dicom predict``).
- ``apps.node`` (``openkbp-dicom serve``: a DICOM node around the clinic's path).
- The command lines, the only modules that print: ``apps.cli`` (``openkbp-train``,
  ``openkbp-score``), ``apps.dicom_cli`` (``openkbp-dicom``), ``apps.demo``.

Importing this package imports neither TensorFlow nor Keras.
"""

__version__ = "0.1.0"
