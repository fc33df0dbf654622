"""Fast OpenKBP dose-prediction training.

Subpackages: ``data`` (CSV I/O, HDF5 cache, stacked arrays, phantoms), ``networks`` (the U-Net
builder), ``metrics`` (the challenge's dose and DVH scores), ``training`` (config, callbacks, the
run itself), ``dicom`` (a clinic's CT, RTSTRUCT and RTDOSE in, an RT Dose out; the ``dicom``
extra). Importing this package imports neither TensorFlow nor Keras.
"""

__version__ = "0.1.0"
