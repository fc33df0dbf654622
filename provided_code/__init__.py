"""Fast OpenKBP dose-prediction training.

Subpackages: ``data`` (CSV I/O, HDF5 cache, stacked arrays, phantoms), ``networks`` (the U-Net
builder), ``metrics`` (the challenge's dose and DVH scores), ``training`` (the step, the loop,
callbacks, the run itself), ``dicom`` (a clinic's CT, RTSTRUCT and RTDOSE in, an RT Dose out; the ``dicom``
extra). Modules: ``config`` (the one run configuration, saved as JSON), ``errors``, ``inference``
(a model's doses at 128³), ``predict`` (``--predict-only``), ``clinic`` (``openkbp-dicom
predict``), the command lines ``cli`` and ``dicom_cli``. Importing this package imports neither
TensorFlow nor Keras.
"""

__version__ = "0.1.0"
