"""Cross-validation of a model (``--folds N --fold K``): its training patients dealt into N folds once,
and where each fold's run lives. The model's folder, ``results/<model-name>/``, holds::

    splits.json        the dealing: each fold's held-out patients, the seed, where they were read
    fold-<K>/          fold K's run folder (provided_code/run_folder.py: its own lock, log, resume):
                       trained on the other folds' patients, validated, scored and its best
                       checkpoint picked on its own held-out fold, whose out-of-fold predictions it
                       writes into fold-<K>/held-out-predictions/
    commissioning/     what openkbp-commission writes from the folds

The dealing depends only on the patients' folder names and the seed: the names sorted (pt_2 before
pt_10), permuted by a generator seeded with (seed, N), and dealt round-robin, so the folds differ in
size by at most one patient. Like nnU-Net's ``splits_final.json``, it is written by the first fold
to run and checked by every later fold and every resume: another N or seed, or a patient added to
(or gone from) the data folder since, is refused in one line naming it, never dealt silently. Two
folds started at once on two machines write the same file (atomically), so either may be first.

Excluded patients (``--exclude``) are dealt like the others (the dealing does not change with the
exclusions); each fold leaves them out of its training and of its held-out fold.

Pure Python and numpy: importing this imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np

from provided_code.errors import UserError
from provided_code.infra.atomic import write_text_atomic
from provided_code.infra.checksum import file_checksum

SPLITS_FILE = "splits.json"
SPLITS_FORMAT = 1
HELD_OUT_STAGE = "held-out"  # a fold's out-of-fold predictions: fold-<K>/held-out-predictions/
MADE_WITH = "made_with"  # their scores.json's record of what made them (held_out_record)
_FOLD_FOLDER = re.compile(r"^fold-(\d+)$")


class FoldsError(UserError, ValueError):
    """A cross-validation that cannot go on as asked: one line naming the file and what differs."""


def natural_key(name: str):
    """``pt_2`` before ``pt_10``: digits compared as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def fold_folder_name(fold: int) -> str:
    return f"fold-{fold}"


def fold_dir(model_dir: os.PathLike | str, fold: int) -> Path:
    """``results/<model-name>/fold-<K>``: fold K's run folder."""
    return Path(model_dir) / fold_folder_name(fold)


def fold_of_folder(path: os.PathLike | str) -> int | None:
    """K for a folder called ``fold-<K>``, else None."""
    found = _FOLD_FOLDER.match(Path(path).name)
    return int(found.group(1)) if found else None


@dataclasses.dataclass(frozen=True)
class Dealing:
    """The patients of each fold's held-out part (fold K: ``held_out[K - 1]``), as dealt."""

    folds: int
    seed: int
    held_out: tuple[tuple[str, ...], ...]
    source: str = ""  # the training split they were read from, for messages

    @property
    def patients(self) -> tuple[str, ...]:
        return tuple(sorted((p for part in self.held_out for p in part), key=natural_key))

    def held_out_of(self, fold: int, excluded=()) -> tuple[str, ...]:
        """Fold ``fold``'s held-out patients, but for those in ``excluded`` (left out of every fold)."""
        check_fold(self.folds, fold)
        left_out = set(excluded)
        return tuple(pid for pid in self.held_out[fold - 1] if pid not in left_out)

    def fold_of(self, patient: str) -> int:
        found = [k + 1 for k, part in enumerate(self.held_out) if patient in part]
        if not found:
            raise FoldsError(f"{patient} was not dealt into the folds ({self.source or 'the training split'})")
        return found[0]

    def to_dict(self) -> dict:
        return {"format": SPLITS_FORMAT, "folds": self.folds, "seed": self.seed, "source": self.source,
                "held_out": [list(part) for part in self.held_out]}

    @classmethod
    def from_dict(cls, data, path) -> "Dealing":
        try:
            if data.get("format") != SPLITS_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {SPLITS_FORMAT}")
            held_out = tuple(tuple(str(p) for p in part) for part in data["held_out"])
            dealing = cls(int(data["folds"]), int(data["seed"]), held_out, str(data.get("source", "")))
            if len(held_out) != dealing.folds:
                raise ValueError(f"{len(held_out)} held-out lists for {dealing.folds} folds")
            if len(set(dealing.patients)) != len(dealing.patients):
                raise ValueError("a patient is in two folds")
        except (AttributeError, KeyError, TypeError, ValueError) as error:
            raise FoldsError(f"{path}: not a dealing of folds ({error}); it is written by the first fold of a "
                             f"model: move it away only if no fold has been trained") from None
        return dealing


def held_out_record(checkpoint: os.PathLike | str, epoch: int, sha256: str, predictions_dir: os.PathLike | str,
                    patients, sources: dict[str, dict[str, str]]) -> dict:
    """What a fold's out-of-fold predictions were made with, as their ``scores.json`` keeps it
    (under :data:`MADE_WITH`), for ``openkbp-commission`` to certify that what it measures is what
    it names: the ``checkpoint`` (its epoch, file name and ``sha256``, as hashed when the model
    that predicted was opened: the file loaded), each patient's prediction file
    as written (``predictions``: ``{patient: SHA-256 of <patient>.csv}`` in ``predictions_dir``) and
    each patient's files as read (``sources``: ``{patient: {file name: SHA-256}}`` of every file its
    figures are computed from, :func:`provided_code.data.csv_io.source_files`; records written
    before held only the plans' ``{patient: SHA-256 of its dose.csv}``, under ``plans``)."""
    checkpoint, predictions_dir = Path(checkpoint), Path(predictions_dir)
    return {"checkpoint": {"epoch": int(epoch), "file": checkpoint.name, "sha256": sha256},
            "predictions": {pid: file_checksum(predictions_dir / f"{pid}.csv") for pid in patients},
            "sources": {pid: dict(sources[pid]) for pid in patients}}


def check_fold(folds: int, fold: int) -> None:
    if not 1 <= fold <= folds:
        raise FoldsError(f"Invalid `fold`. Expected 1 to {folds} (--folds {folds}). Received: fold={fold}")


def deal(patients: list[str], folds: int, seed: int, source: str = "") -> Dealing:
    """``patients`` dealt into ``folds`` held-out parts (see the module docstring)."""
    names = sorted(set(patients), key=natural_key)
    if folds < 2 or len(names) < folds:
        raise FoldsError(f"Invalid `folds`. Expected 2 or more, and at most the {len(names)} training patients of "
                         f"{source or 'the data folder'}. Received: folds={folds}")
    order = np.random.default_rng([seed, folds]).permutation(len(names))
    held_out = [[] for _ in range(folds)]
    for position, index in enumerate(order):
        held_out[position % folds].append(names[index])
    return Dealing(folds, seed, tuple(tuple(sorted(part, key=natural_key)) for part in held_out), source)


def read_dealing(model_dir: os.PathLike | str) -> Dealing | None:
    """The model's ``splits.json`` (None: no fold has run yet)."""
    path = Path(model_dir) / SPLITS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise FoldsError(f"{path}: not a dealing of folds ({error})") from None
    return Dealing.from_dict(data if isinstance(data, dict) else {}, path)


def dealing_for(model_dir: os.PathLike | str, patients: list[str], folds: int, seed: int,
                source: str = "") -> Dealing:
    """The dealing of the model in ``model_dir`` for ``patients`` (the training split's, all of
    them): the one in its ``splits.json``, checked against the request and the patients, or made
    and written now (the first fold)."""
    path = Path(model_dir) / SPLITS_FILE
    saved = read_dealing(model_dir)
    if saved is None:
        dealing = deal(patients, folds, seed, source)
        if _create(path, json.dumps(dealing.to_dict(), indent=1) + "\n"):
            return dealing
        saved = read_dealing(model_dir)  # another fold, started at the same moment, dealt first: held to its
    if (saved.folds, saved.seed) != (folds, seed):
        raise FoldsError(f"{path}: the model's patients were dealt into {saved.folds} folds with --seed {saved.seed}; "
                         f"requested --folds {folds} --seed {seed}. Every fold of a model is dealt alike: pass "
                         f"--folds {saved.folds} --seed {saved.seed}, or choose a new --model-name.")
    check_patients(saved, patients, path, source)
    return saved


def check_patients(dealing: Dealing, patients: list[str], path: os.PathLike | str, source: str = "") -> None:
    """A :class:`FoldsError` naming the patients of ``patients`` (the training split's, all of
    them) that were not dealt, and those dealt that are gone: a model's folds hold the patients they
    were dealt (``path``: its dealing, for the message)."""
    added = sorted(set(patients) - set(dealing.patients), key=natural_key)
    gone = sorted(set(dealing.patients) - set(patients), key=natural_key)
    if added or gone:
        said = "; ".join(part for part in (
            f"{_listed(added)} {'is' if len(added) == 1 else 'are'} in {source or 'the training split'} but not "
            f"dealt" if added else "",
            f"{_listed(gone)} {'was' if len(gone) == 1 else 'were'} dealt but {'is' if len(gone) == 1 else 'are'} "
            f"not in {source or 'the training split'} any more" if gone else "") if part)
        raise FoldsError(f"{path}: the training patients changed since the folds were dealt ({said}). A model's folds "
                         f"hold the patients they were dealt: train a new --model-name for the new cohort (or "
                         f"restore the data folder).")


def _create(path: Path, text: str) -> bool:
    """Write ``text`` at ``path`` whole, unless a file is there already (False): a temporary file
    linked to the name, which fails if another process created it first (two folds started at once,
    with other settings: the second is held to the first's dealing, not the last writer's)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_text_atomic(temporary, text)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)


def _listed(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def fold_members(model_dir: os.PathLike | str) -> list[Path] | None:
    """The run folders of a cross-validated model's folds, fold 1 to N, which serve together as the
    deployed ensemble (as nnU-Net deploys its folds); None when ``model_dir`` is not
    cross-validated (no ``splits.json``). A :class:`FoldsError` names the folds missing."""
    dealing = read_dealing(model_dir)
    if dealing is None:
        return None
    folders = fold_folders(model_dir)
    missing = [k for k in range(1, dealing.folds + 1) if k not in folders]
    if missing:
        raise FoldsError(f"{model_dir}: the cross-validated model's fold {', '.join(map(str, missing))} of "
                         f"{dealing.folds} is missing (fold-<K>/): its folds serve together")
    return [folders[k] for k in range(1, dealing.folds + 1)]


def fold_folders(model_dir: os.PathLike | str) -> dict[int, Path]:
    """``{K: results/<model>/fold-<K>}`` of the fold folders present."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return {}
    found = {fold_of_folder(path): path for path in model_dir.iterdir() if path.is_dir()}
    return dict(sorted((k, v) for k, v in found.items() if k is not None))
