"""The one error of the DICOM layer: it names the file and the problem."""

from __future__ import annotations

import os

from provided_code.errors import UserError


class DicomInputError(UserError, ValueError):
    """A DICOM input (or a folder of them) that cannot be used. The message is one line:
    ``<path>: <problem>``."""

    def __init__(self, path: os.PathLike | str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):
        return type(self), (self.path, self.problem)


def require_site(site):
    """``site`` when it is a :class:`~provided_code.sites.Site`; the DICOM layer takes no site by
    name and assumes none (the command lines resolve ``--site`` with
    :func:`~provided_code.sites.load_site`)."""
    from provided_code.sites import Site

    if not isinstance(site, Site):
        raise TypeError(f"Invalid `site`. Expected a Site (provided_code.sites.load_site). Received: site={site!r}")
    return site


def require_pydicom():
    """The ``pydicom`` module, or a one-line error saying how to install it."""
    try:
        import pydicom
    except ImportError:
        raise DicomInputError("pydicom", "not installed: pip install 'provided_code[dicom]'") from None
    return pydicom


class CohortError(UserError, ValueError):
    """A cohort-wide problem of ``openkbp-dicom import-cohort``: the archive, the output folder, the identity map."""
