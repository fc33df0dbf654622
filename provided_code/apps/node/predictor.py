"""The model of a node: its folder locked shared for the node's life, loaded once at start, warmed
up, then asked one patient at a time with the settings (site, resolution, inputs) it was loaded
with; no file of the model folder is read again while the node serves."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path

import numpy as np

from provided_code.apps.clinic import OUTPUTS, predict_dicom_patient
from provided_code.deployed_model import DeployedModel
from provided_code.dicom.names import load_names
from provided_code.metrics.calibration import DEFAULT_COVERAGE, check_coverage

logger = logging.getLogger(__name__)

LOCK_HOLDER = "a DICOM node serving it (openkbp-dicom serve)"  # what a refused training run is told


@dataclasses.dataclass(frozen=True)
class Prediction:
    used: str  # the model in a few words: "epoch <N>", or "<N> folds" averaged (DeployedModel.label)
    warnings: tuple[str, ...] = ()  # the import's warnings (skipped contours, missing structures, ...)
    band: float | None = None  # the nominal coverage of the dvh table's bands (None: the model has none)
    in_distribution: dict | None = None  # the in-distribution check (provided_code.trust.Trust.in_distribution)
    uncommissioned: bool = False  # neither bands nor the check (provided_code.trust.Trust.uncommissioned)
    dose_ceiling: dict | None = None  # the dose above the site's plausible ceiling (metrics.ceiling.AboveCeiling's)


class ModelPredictor:
    """``predictor(ct_dir, rtstruct, out_dir, rtdose)`` writes ``openkbp-dicom predict``'s outputs
    (without plots) into ``out_dir`` with a model kept in memory; returns a :class:`Prediction`.

    From construction to :meth:`close` (or the process's end) it holds the model folder's lock
    shared (a cross-validated model's: each fold's, whose folds predict together): a training run
    (or ``--start-over``) on the folder is refused in one line naming this process, while other
    readers (another node, an ensemble) may read it too. What the model's commissioning lets its
    predictions say (bands of nominal coverage ``band``, the in-distribution check) is read once
    too, at construction, and logged."""

    rtdose_file = OUTPUTS["rtdose"]  # the RT Dose among the outputs

    def __init__(self, model_dir: os.PathLike | str, epoch: int | str | None = None, tta: bool = False,
                 names: os.PathLike | str | None = None, allow_missing_targets: bool = False,
                 band: float = DEFAULT_COVERAGE):
        self.model_dir = Path(model_dir)
        band = check_coverage(band)  # before the models load
        self._locks = contextlib.ExitStack()
        try:
            self.model = self._locks.enter_context(DeployedModel.locked(self.model_dir, LOCK_HOLDER, epoch)).loaded()
            self.trust = self.model.trust(band)
            # the names file read once (a broken one fails the node's start, not its first patient)
            self.names = load_names(names, self.model.site)
            self.tta, self.allow_missing_targets = tta, allow_missing_targets
            self._warm_up()
        except BaseException:
            self.close()
            raise
        logger.info("Model %s loaded: %s", self.model_dir,
                    ", ".join(f"{member.name} at epoch {member.epoch}" for member in self.model.members))
        for line in self.trust.lines():
            logger.info("Model %s: %s", self.model_dir, line)

    def _warm_up(self) -> None:
        """One prediction on zeros, so that the first patient does not pay for tracing the models."""
        for trained in self.model.models:
            model = trained.model
            inputs = {tensor.name.split(":")[0]: np.zeros((1, *tensor.shape[1:]), tensor.dtype)
                      for tensor in model.inputs}
            model.predict_on_batch(inputs)

    def __call__(self, ct_dir: Path, rtstruct: Path, out_dir: Path, rtdose: Path | None = None) -> Prediction:
        report = predict_dicom_patient(self.model, ct_dir, rtstruct, out_dir, rtdose=rtdose, tta=self.tta,
                                       names=self.names, allow_missing_targets=self.allow_missing_targets,
                                       plots=False, trust=self.trust)
        warnings = tuple(line for line in report.imported.lines if line.startswith(("warning:", "missing:")))
        band = report.dvh.get("band")
        return Prediction(self.model.label, warnings, band=band["coverage"] if band else None,
                          in_distribution=report.dvh.get("in_distribution"), uncommissioned=self.trust.uncommissioned,
                          dose_ceiling=report.dvh.get("dose_ceiling"))

    def close(self) -> None:
        """Release the model folder's lock (each fold's)."""
        self._locks.close()

    def __enter__(self) -> "ModelPredictor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
