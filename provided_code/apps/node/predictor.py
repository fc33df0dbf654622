"""The model of a node: loaded once at start, warmed up, then asked one patient at a time."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from provided_code.apps.clinic import predict_dicom_patient
from provided_code.run_folder import RunFolder

logger = logging.getLogger(__name__)


class ModelPredictor:
    """``predictor(ct_dir, rtstruct, out_dir, rtdose)`` writes ``openkbp-dicom predict``'s outputs
    (without plots) into ``out_dir`` with a model kept in memory; returns the checkpoint's epoch."""

    def __init__(self, model_dir: os.PathLike | str, epoch: int | str | None = None, tta: bool = False,
                 names: os.PathLike | str | None = None, allow_missing_targets: bool = False):
        self.model_dir = Path(model_dir)
        folder = RunFolder(self.model_dir)
        self.loaded = folder.load_trained_model(folder.epoch_to_apply(epoch))
        self.epoch = self.loaded.epoch
        self.tta, self.names, self.allow_missing_targets = tta, names, allow_missing_targets
        self._warm_up()
        logger.info("Model %s at epoch %s loaded", self.model_dir, self.epoch)

    def _warm_up(self) -> None:
        """One prediction on zeros, so that the first patient does not pay for tracing the model."""
        model = self.loaded.model
        inputs = {tensor.name.split(":")[0]: np.zeros((1, *tensor.shape[1:]), tensor.dtype) for tensor in model.inputs}
        model.predict_on_batch(inputs)

    def __call__(self, ct_dir: Path, rtstruct: Path, out_dir: Path, rtdose: Path | None = None) -> int:
        report = predict_dicom_patient(self.model_dir, ct_dir, rtstruct, out_dir, rtdose=rtdose, tta=self.tta,
                                       names=self.names, allow_missing_targets=self.allow_missing_targets,
                                       plots=False, loaded=self.loaded)
        return report.epoch
