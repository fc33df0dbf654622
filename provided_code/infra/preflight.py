"""Checks a run makes before TensorFlow loads and the data is read: the data is where the flags
say, and every folder the run writes to can be written. A typo or a read-only disk then costs a
second, not TensorFlow's start-up and a cache build."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from provided_code.errors import ConfigError, UserError

OPENKBP_SOURCE = ("OpenKBP data comes from the challenge's public repository "
                  "(https://github.com/ababier/open-kbp, folder provided-data/). Download it and pass "
                  "--data-dir PATH, the folder that holds train-pats/ (and validation-pats/, test-pats/); "
                  "or run `bash scripts/demo` to try the whole pipeline on synthetic phantoms.")


class DataNotFoundError(UserError, FileNotFoundError):
    """The data folder or its training split is missing; the message says where data comes from."""


def require_training_data(data_dir: os.PathLike | str) -> Path:
    """``<data_dir>/train-pats``, or a :class:`DataNotFoundError` saying where the data comes from."""
    train_dir = Path(data_dir) / "train-pats"
    if not train_dir.is_dir():
        raise DataNotFoundError(f"No training data: {train_dir} does not exist. {OPENKBP_SOURCE} A clinic's own "
                                f"plans (any site): openkbp-dicom import-cohort ARCHIVE --site SITE --out DATA_DIR.")
    return train_dir


def check_writable(folder: os.PathLike | str, what: str) -> Path:
    """Create ``folder`` if needed and write and remove a file in it; a :class:`ConfigError`
    naming the folder and the reason if that fails."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=folder, prefix=".write-check-")
        os.close(handle)
        os.unlink(probe)
    except OSError as error:
        raise ConfigError(f"Cannot write to the {what} {folder}: {error.strerror or error}") from None
    return folder


def check_run_folders(data_dir: os.PathLike | str, run_dir: os.PathLike | str, cache_dir: os.PathLike | str,
                      predict_only: bool = False, stage: str = "validation") -> None:
    """The checks for one ``runpod_train.py`` run: its data folder, its model's folder
    (``results/<model-name>``) and its cache folder (resolved: the default when not given)."""
    run_dir = Path(run_dir)
    if predict_only:
        stage_dir = Path(data_dir) / f"{stage}-pats"
        if not stage_dir.is_dir():
            raise DataNotFoundError(f"No {stage} data: {stage_dir} does not exist. {OPENKBP_SOURCE}")
        if run_dir.is_dir():  # a missing model is predict's own error, with its advice
            check_writable(run_dir, "results folder (--results-dir, --model-name)")
    else:
        require_training_data(data_dir)
        check_writable(run_dir, "results folder (--results-dir, --model-name)")
    check_writable(cache_dir, "cache folder (--cache-dir, $OPENKBP_CACHE_DIR)")
