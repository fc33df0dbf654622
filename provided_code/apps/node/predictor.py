"""The model of a node: its folder locked shared for the node's life, loaded once at start, warmed
up, then asked one patient at a time with the settings (site, resolution, inputs) it was loaded
with; no file of the model folder is read again while the node serves."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from provided_code.apps.clinic import OUTPUTS, predict_dicom_patient
from provided_code.run_folder import RunFolder

logger = logging.getLogger(__name__)

LOCK_HOLDER = "a DICOM node serving it (openkbp-dicom serve)"  # what a refused training run is told


@dataclasses.dataclass(frozen=True)
class Prediction:
    epoch: int  # the checkpoint's
    warnings: tuple[str, ...] = ()  # the import's warnings (skipped contours, missing structures, ...)


class ModelPredictor:
    """``predictor(ct_dir, rtstruct, out_dir, rtdose)`` writes ``openkbp-dicom predict``'s outputs
    (without plots) into ``out_dir`` with a model kept in memory; returns a :class:`Prediction`.

    From construction to :meth:`close` (or the process's end) it holds the model folder's lock
    shared: a training run (or ``--start-over``) on the folder is refused in one line naming this
    process, while other readers (another node, an ensemble) may read it too."""

    rtdose_file = OUTPUTS["rtdose"]  # the RT Dose among the outputs

    def __init__(self, model_dir: os.PathLike | str, epoch: int | str | None = None, tta: bool = False,
                 names: os.PathLike | str | None = None, allow_missing_targets: bool = False):
        self.model_dir = Path(model_dir)
        folder = RunFolder(self.model_dir)
        self._lock = folder.lock(LOCK_HOLDER, shared=True)
        self._lock.__enter__()
        try:
            self.loaded = folder.load_trained_model(folder.epoch_to_apply(epoch))
            self.epoch = self.loaded.epoch
            self.tta, self.names, self.allow_missing_targets = tta, names, allow_missing_targets
            self._warm_up()
        except BaseException:
            self.close()
            raise
        logger.info("Model %s at epoch %s loaded", self.model_dir, self.epoch)

    def _warm_up(self) -> None:
        """One prediction on zeros, so that the first patient does not pay for tracing the model."""
        model = self.loaded.model
        inputs = {tensor.name.split(":")[0]: np.zeros((1, *tensor.shape[1:]), tensor.dtype) for tensor in model.inputs}
        model.predict_on_batch(inputs)

    def __call__(self, ct_dir: Path, rtstruct: Path, out_dir: Path, rtdose: Path | None = None) -> Prediction:
        report = predict_dicom_patient(self.model_dir, ct_dir, rtstruct, out_dir, rtdose=rtdose, tta=self.tta,
                                       names=self.names, allow_missing_targets=self.allow_missing_targets,
                                       plots=False, loaded=self.loaded)
        warnings = tuple(line for line in report.imported.lines if line.startswith(("warning:", "missing:")))
        return Prediction(report.epoch, warnings)

    def close(self) -> None:
        """Release the model folder's lock."""
        self._lock.__exit__(None, None, None)

    def __enter__(self) -> "ModelPredictor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
