"""What a model was trained on, file by file: each training patient's source files (every file its
figures are computed from, :func:`provided_code.data.csv_io.source_files`) by their SHA-256 as the
cache read them (``SplitArrays.sources``), and the comparisons commissioning makes of such records.

A fold of a cross-validated model records its training patients' files when it trains
(:func:`record_training`, into its run folder's ``models/trained_on.json``)::

    {"format": 1,
     "versions": [{"from_epoch": 1, "split": "/data/train-pats",
                   "patients": {"pt_1": {"ct.csv": "<SHA-256>", "dose.csv": "<SHA-256>", ...}, ...}}]}

A resume that reads the same files adds nothing; one that reads other files (a plan replaced
between two runs of the fold) adds a version from the epoch it trains first, so the record says
which epochs were trained on which files. A version from an epoch that a later resume trains again
(its checkpoints were not kept) is dropped: the weights never saw it.

Pure Python: importing this imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from provided_code.errors import UserError
from provided_code.infra.atomic import write_text_atomic

logger = logging.getLogger(__name__)

RECORD_FORMAT = 1

Sources = dict[str, dict[str, str]]  # {patient: {file name: SHA-256}}


class ProvenanceError(UserError, ValueError):
    """A record of what a model trained on that cannot be read: one line naming the file."""


def record_training(path: os.PathLike | str, arrays, first_epoch: int) -> None:
    """Record in ``path`` that the epochs from ``first_epoch`` (1-based) on are trained on
    ``arrays``' patients, each by the SHA-256 of its files (module docstring); nothing when the
    arrays do not know their files (patients not read through the cache)."""
    path = Path(path)
    sources = arrays.sources_of()
    if sources is None:
        logger.warning("The training patients' files are not known (not read through the cache): %s is not "
                       "written", path)
        return
    try:
        versions = read_training(path) or []
    except ProvenanceError as error:
        logger.warning("%s; written anew from epoch %d", error, first_epoch)
        versions = []
    kept = [version for version in versions if version["from_epoch"] < first_epoch]  # trained again: dropped
    split = str(Path(arrays.folder).resolve()) if arrays.folder is not None else ""
    if kept and kept[-1]["patients"] == sources and kept[-1]["split"] == split:
        if kept == versions:
            return
    else:
        kept.append({"from_epoch": int(first_epoch), "split": split, "patients": sources})
    write_text_atomic(path, json.dumps({"format": RECORD_FORMAT, "versions": kept}, sort_keys=True) + "\n")


def read_training(path: os.PathLike | str) -> list[dict] | None:
    """The versions of a training record (:func:`record_training`), oldest first; None when there
    is none (a model trained before runs recorded their data); a :class:`ProvenanceError` naming the
    file when it is not such a record."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != RECORD_FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {RECORD_FORMAT}")
        versions = [{"from_epoch": int(version["from_epoch"]), "split": str(version.get("split", "")),
                     "patients": {str(pid): {str(name): str(sha) for name, sha in files.items()}
                                  for pid, files in version["patients"].items()}}
                    for version in data["versions"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ProvenanceError(f"{path}: not a record of the files a run trained on ({error})") from None
    return versions


def differing_files(first: dict[str, str], second: dict[str, str]) -> list[str]:
    """The file names whose SHA-256 differs between two accounts of one patient's files (a file
    present in one only differs)."""
    return sorted(name for name in set(first) | set(second) if first.get(name) != second.get(name))


def disagreement(accounts: dict[str, dict[str, str]]) -> tuple[str, dict[str | None, list[str]]] | None:
    """Where several accounts of one patient's files (``{who: {file name: SHA-256}}``) disagree:
    ``(file, {SHA-256 or None (absent): [who, ...]})`` for the first file (by name) that differs,
    the accounts grouped by what they hold of it in their order; None when they agree."""
    names = sorted({name for files in accounts.values() for name in files})
    for name in names:
        groups: dict[str | None, list[str]] = {}
        for who, files in accounts.items():
            groups.setdefault(files.get(name), []).append(who)
        if len(groups) > 1:
            return name, groups
    return None


def digest(sources: Sources) -> str:
    """One SHA-256 of a set of patients' files (``{patient: {file name: SHA-256}}``): the same
    patients with the same files give the same digest, whatever their folder."""
    text = json.dumps(sources, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
