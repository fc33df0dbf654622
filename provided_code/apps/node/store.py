"""The node's store: every received object under a path made of its validated UIDs, written whole.

Layout of ``STORE/``::

    journal.sqlite                       the journal (see ``journal``)
    .lock                                held by the node serving the store (one at a time)
    objects/<SeriesInstanceUID>/<SOPInstanceUID>.dcm   every object received, as received
    results/<structure set SOPInstanceUID>/            a patient's RD.dcm, dose.nii.gz, dvh.csv, ...
    incoming/                            temporary files, emptied at start

A UID names a file only when it is digits and dots (DICOM PS3.5 §9.1: at most 64 characters,
components of digits separated by single dots), so no tag text can reach outside the store.

The store holds patient data: its folders are the owner's only (0700) and so are the files the
node writes (0600), whatever the process's umask.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from provided_code.errors import UserError
from provided_code.infra.atomic import fsync_folder, new_folder_beside, replace_folder, tidy_folder

logger = logging.getLogger(__name__)

JOURNAL_FILE = "journal.sqlite"
LOCK_FILE = ".lock"  # held by the node serving the store, for its life
FOLDER_MODE, FILE_MODE = 0o700, 0o600  # the owner's only
UID_PATTERN = re.compile(r"[0-9]+(\.[0-9]+)*")
MAX_UID_LENGTH = 64


class InvalidUIDError(UserError, ValueError):
    """A UID that may not name a file."""


def check_uid(value, what: str) -> str:
    """``value`` as a UID string if it is digits and dots (at most 64 characters), else a one-line error."""
    text = "" if value is None else str(value)
    if len(text) > MAX_UID_LENGTH or not UID_PATTERN.fullmatch(text):
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise InvalidUIDError(f"Invalid `{what}`. Expected a UID of digits and dots, at most {MAX_UID_LENGTH} "
                              f"characters. Received: {what}={shown!r}")
    return text


class Store:
    """The folders of a node's store (created when missing, and made the owner's only)."""

    def __init__(self, root: os.PathLike | str):
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.results = self.root / "results"
        self.incoming = self.root / "incoming"
        for folder in (self.root, self.objects, self.results, self.incoming):
            _owner_folder(folder)
        self._resolved = self.root.resolve()

    @property
    def journal_path(self) -> Path:
        return self.root / JOURNAL_FILE

    def _inside(self, path: Path) -> Path:
        """``path``, after checking that it resolves inside the store (a second guard behind the UID check)."""
        if not path.resolve().is_relative_to(self._resolved):
            raise InvalidUIDError(f"Invalid path. Expected a path inside the store {self.root}. Received: {path}")
        return path

    def series_dir(self, series_uid: str) -> Path:
        return self._inside(self.objects / check_uid(series_uid, "SeriesInstanceUID"))

    def object_path(self, series_uid: str, sop_instance_uid: str) -> Path:
        return self._inside(self.series_dir(series_uid) / f"{check_uid(sop_instance_uid, 'SOPInstanceUID')}.dcm")

    def result_dir(self, structure_set_uid: str) -> Path:
        return self._inside(self.results / check_uid(structure_set_uid, "SOPInstanceUID"))

    def write_object(self, series_uid: str, sop_instance_uid: str, data: bytes) -> Path:
        """Write ``data`` to the object's path: a temporary file in ``incoming/``, flushed to disk,
        then moved into place (an earlier copy of the same instance is replaced whole)."""
        path = self.object_path(series_uid, sop_instance_uid)
        if not path.parent.is_dir():
            _owner_folder(path.parent)
        tmp = self.incoming / f"{sop_instance_uid}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
            fsync_folder(path.parent)
        finally:
            if tmp.exists():
                tmp.unlink()
        return path

    def staging_dir(self, structure_set_uid: str) -> Path:
        """A new empty folder beside the patient's result folder, to be committed by :meth:`commit_result`."""
        staging = new_folder_beside(self.result_dir(structure_set_uid))
        os.chmod(staging, FOLDER_MODE)
        return staging

    def commit_result(self, staging: Path, structure_set_uid: str) -> Path:
        """Put a finished staging folder at the patient's result folder whole, an earlier result
        replaced (:func:`~provided_code.infra.atomic.replace_folder`); what it holds made the
        owner's only first (its writers create files with the umask's permissions)."""
        final = self.result_dir(structure_set_uid)
        self.owner_only(staging)
        replace_folder(staging, final)
        return final

    @staticmethod
    def owner_only(path: os.PathLike | str) -> None:
        """Make ``path`` (a file, or a folder and all it holds) the owner's only."""
        path = Path(path)
        os.chmod(path, FOLDER_MODE if path.is_dir() else FILE_MODE)
        if path.is_dir():
            for folder, folders, files in os.walk(path):
                for name in folders:
                    os.chmod(os.path.join(folder, name), FOLDER_MODE)
                for name in files:
                    os.chmod(os.path.join(folder, name), FILE_MODE)

    def clean_temporaries(self) -> int:
        """Remove what an interrupted run left half-written: ``incoming/*`` and hidden staging
        folders under ``results/``. Returns how many were removed."""
        removed = 0
        for path in self.incoming.iterdir():
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
        left = sorted(self.results.glob(".*"))  # .<uid>.tmp-<pid> being filled, .<uid>.old-<pid> being replaced
        for name in {path.name[1:].rsplit(".", 1)[0] for path in left}:
            tidy_folder(self.results / name)  # an old result whose replacement was cut short is put back
        return removed + sum(not path.exists() for path in left)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free


def _owner_folder(folder: Path) -> None:
    """``folder`` made if missing, and the owner's only (an existing one is tightened, or a warning
    says why it could not be)."""
    folder.mkdir(mode=FOLDER_MODE, parents=True, exist_ok=True)  # the mode is masked by the umask: set it after
    if stat.S_IMODE(folder.stat().st_mode) != FOLDER_MODE:
        try:
            os.chmod(folder, FOLDER_MODE)
        except OSError as error:
            logger.warning("%s is not the owner's only and cannot be made so (%s): protect it yourself", folder,
                           error.strerror)
