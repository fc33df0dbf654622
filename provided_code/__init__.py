"""Fast OpenKBP dose-prediction training.

Its layers, and what each holds: docs/development.md (``tests/test_architecture.py`` keeps the
imports running downwards and that page's table in step with them).

Importing this package imports neither TensorFlow nor Keras.
"""

__version__ = "0.1.0"
