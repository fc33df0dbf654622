"""What the tests and the benchmarks share, outside the package: the package does not ship it and
imports nothing of it (``tests/test_architecture.py``), and it holds no tests.

The tests import it as ``tests.kit`` (pytest puts the repository's root on the path); a script of
``scripts/`` run as ``python scripts/x.py`` puts the root there itself before importing it. Its
modules need the ``dev`` extra where they say so (scikit-image, pydicom, pynetdicom).
"""
