"""A data folder (``--data-dir``): where each split of patients lives. The one module that knows the
layout; training, prediction, the demo and the cohort import ask it::

    train-pats/pt_<N>/           the patients a model is trained on
    validation-pats/pt_<N>/      held out: validated and scored during training, predicted by
                                 --predict-only --stage validation
    test-pats/pt_<N>/            --predict-only --stage test (doses optional)

(A patient folder's own files: :mod:`provided_code.data.csv_io`; what a cohort import writes
beside the splits, its manifest and identity map: :mod:`provided_code.dicom.cohort`.)

Pure Python: importing this imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import os
from pathlib import Path

from provided_code.errors import UserError

SPLITS = ("train", "validation", "test")
STAGES = ("validation", "test")  # the splits --predict-only predicts
OPENKBP_SOURCE = ("OpenKBP data comes from the challenge's public repository "
                  "(https://github.com/ababier/open-kbp, folder provided-data/). Download it and pass "
                  "--data-dir PATH, the folder that holds train-pats/ (and validation-pats/, test-pats/); "
                  "or run `bash scripts/demo` to try the whole pipeline on synthetic phantoms.")


class DataNotFoundError(UserError, FileNotFoundError):
    """The data folder or one of its splits is missing; the message says where data comes from."""


def split_folder_name(split: str) -> str:
    """``train`` -> ``train-pats``: the folder of a split."""
    if split not in SPLITS:
        raise ValueError(f"Invalid `split`. Expected one of {SPLITS}. Received: split={split!r}")
    return f"{split}-pats"


def split_dir(data_dir: os.PathLike | str, split: str) -> Path:
    """``<data_dir>/<split>-pats``."""
    return Path(data_dir) / split_folder_name(split)


def require_split(data_dir: os.PathLike | str, split: str) -> Path:
    """``<data_dir>/<split>-pats``, or a :class:`DataNotFoundError` saying where data comes from (a
    missing training split: also a clinic's own plans, through the cohort import)."""
    folder = split_dir(data_dir, split)
    if not folder.is_dir():
        if split == "train":
            raise DataNotFoundError(f"No training data: {folder} does not exist. {OPENKBP_SOURCE} A clinic's own "
                                    f"plans (any site): openkbp-dicom import-cohort ARCHIVE --site SITE --out DATA_DIR.")
        raise DataNotFoundError(f"No {split} data: {folder} does not exist. {OPENKBP_SOURCE}")
    return folder
