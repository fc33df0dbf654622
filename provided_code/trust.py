"""How far to trust a prediction: what a commissioned model's ``commissioning/`` folder lets every
prediction say about itself, read once (:func:`load_trust`) and applied per patient.

A cross-validated model's ``openkbp-commission`` writes, beside its report, the two files
prediction reads (this module is their one home: the folder's name, the files' names and the
bands file's format)::

    results/<model>/commissioning/
        bands.json     per structure and DVH metric, the out-of-fold residuals (predicted − plan,
                       Gy) of every training patient, sorted: any nominal coverage is computed from
                       them when asked (:mod:`provided_code.metrics.calibration`)
        cohort.json    the training cohort's anatomy (:func:`provided_code.metrics.anatomy.fit_cohort`)
        model_card.json  among the commissioning's record, the SHA-256 of both files as written
                       (under ``files``): a file edited since is refused when read, naming it

- **The band** of a predicted DVH metric: ``[low, high]`` holding the achieved plan's value with at
  least the nominal coverage (``--band``, default 90 %), split-conformal on the residuals of the
  folds that never saw each patient. It applies to the model they were made with: the deployed
  ensemble of all its folds, each at its commissioned checkpoint (by SHA-256). The ensemble averages
  the folds, whose errors it partly cancels, so its own errors are likely smaller than the single
  folds' out-of-fold errors the band is made of: the band is conservative for it (measured, with
  what else made it so: docs/trust.md).
- **The in-distribution check**: the patient's anatomy and CT features give one nonconformity
  score, and its conformal p-value against the training patients' leave-one-out scores
  (:func:`provided_code.metrics.anatomy.check`); below the cohort's alpha (recorded in cohort.json,
  0.05 by default) the patient is flagged "outside the training cohort", with the feature that
  adds most to the score and the others that drive it, in words. A patient like the cohort is
  flagged at most alpha of the time. It depends on the anatomy and CT only (not on the
  checkpoints), so it applies to the model's folds at any epoch.

A model without them (a single run, an ensemble of several models, a model not commissioned, or
commissioned before bands existed) predicts as before; :attr:`Trust.why_no_bands` says why in one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Iterable, Mapping

from provided_code.errors import UserError
from provided_code.folds import fold_members, fold_of_folder
from provided_code.metrics import anatomy, calibration
from provided_code.run_folder import RunFolder

logger = logging.getLogger(__name__)

COMMISSIONING_FOLDER = "commissioning"  # results/<model>/commissioning/
BANDS_FILE = "bands.json"
COHORT_FILE = "cohort.json"
CARD_FILE = "model_card.json"  # the commissioning's record, which binds the two files above by their SHA-256
BOUND = "files"  # its key: {file name: SHA-256} of bands.json and cohort.json as commissioning wrote them
BANDS_FORMAT = 1
OUTSIDE = "outside the training cohort"  # what a flagged patient's RT Dose description and messages say
UNCOMMISSIONED = "uncommissioned model"  # what a prediction carrying neither bands nor the check says of its model


class TrustError(UserError, ValueError):
    """A commissioning file that cannot be read: one line naming it."""


def commissioning_folder(model_dir: os.PathLike | str) -> Path:
    return Path(model_dir) / COMMISSIONING_FOLDER


def bands_record(residual_table, *, site_name: str, folds: list[dict]) -> dict:
    """``bands.json``'s content from commissioning's residual table (columns ``patient``,
    ``structure``, ``metric``, ``difference``): the sorted residuals per structure and metric, the
    site, and the folds that made them (``[{"fold": K, "epoch": E, "sha256": the checkpoint's}]``:
    what a prediction checks it is made with)."""
    return {"format": BANDS_FORMAT, "method": calibration.METHOD, "site": site_name, "folds": folds,
            "patients": int(residual_table["patient"].nunique()),
            "residuals": calibration.sorted_residuals(residual_table)}


@dataclasses.dataclass(frozen=True)
class Trust:
    """What a model's commissioning lets its predictions say (module docstring). ``bands``: the
    bands file's content, None without (``why_no_bands`` says why); ``cohort``: the cohort's, None
    without (``why_no_check``); ``coverage``: the bands' nominal coverage."""

    model: str
    coverage: float
    bands: dict | None = None
    cohort: dict | None = None
    why_no_bands: str = ""
    why_no_check: str = ""

    def band(self, predicted: Mapping[str, Mapping[str, float]]) -> dict | None:
        """The band of a predicted DVH table ``{structure: {metric: Gy}}``, as dvh.json holds it:
        ``coverage`` (nominal), ``method``, ``patients`` (of the calibration), ``low`` and ``high``
        (``{structure: {metric: Gy or None}}``), and ``without`` (the structure-metrics with no band
        and why: no residuals, or too few for the coverage). None: the model has no bands."""
        if self.bands is None:
            return None
        residuals = self.bands["residuals"]
        low, high, without = {}, {}, []
        for structure, values in predicted.items():
            low[structure], high[structure] = {}, {}
            for metric, value in values.items():
                found = residuals.get(structure, {}).get(metric)
                bounds = calibration.band(value, found, self.coverage) if found else None
                low[structure][metric], high[structure][metric] = bounds if bounds is not None else (None, None)
                if bounds is None:
                    n = len(found or ())
                    without.append({"structure": structure, "metric": metric, "patients": n,
                                    "reason": (f"no training patient has {structure} {metric}" if not n else
                                               f"{n} training patients give at most "
                                               f"{100 * calibration.largest_coverage(n):.0f} %; "
                                               f"{calibration.patients_needed(self.coverage)} needed")})
        return {"coverage": self.coverage, "method": f"{calibration.METHOD} of {self.bands['patients']} training "
                                                     f"patients (commissioning/{BANDS_FILE})",
                "patients": self.bands["patients"], "low": low, "high": high, "without": without}

    def in_distribution(self, structure_masks, possible_dose_mask, voxel_dimensions, site, ct=None) -> dict | None:
        """The in-distribution check of one patient (its 128³ packed masks, body, voxel size and CT):
        :func:`provided_code.metrics.anatomy.check`'s ``inside`` (False: flagged), ``score``,
        ``p_value``, ``alpha``, ``threshold``, ``feature``, ``too_small`` and ``reasons``, and the
        cohort's ``method`` and ``cohort_patients``. None: the model has no cohort."""
        if self.cohort is None:
            return None
        features = anatomy.anatomy_features(structure_masks, possible_dose_mask, voxel_dimensions, site, ct)
        return {**anatomy.check(self.cohort, features), "method": self.cohort["method"],
                "cohort_patients": len(self.cohort["patients"])}

    @property
    def uncommissioned(self) -> bool:
        """Whether the predictions carry neither bands nor the in-distribution check (a single run, a
        model not commissioned, or bands of other checkpoints and no cohort): what they say of their
        model, :data:`UNCOMMISSIONED`."""
        return self.bands is None and self.cohort is None

    def lines(self) -> list[str]:
        """What the model's predictions carry, in a line each, or why not (one line when neither,
        for one reason)."""
        return [line for line, _ in self._lines()]

    def missing_lines(self) -> list[str]:
        """The lines of :meth:`lines` that say what the predictions do not carry, and why."""
        return [line for line, missing in self._lines() if missing]

    def _lines(self) -> list[tuple[str, bool]]:
        """:meth:`lines` each with whether it says something is missing."""
        if self.bands is None and self.cohort is None and self.why_no_bands == self.why_no_check:
            return [(f"No prediction bands or in-distribution check: {self.why_no_bands}", True)]
        if self.cohort is None:
            check = (f"No in-distribution check: {self.why_no_check}", True)
        else:
            small = anatomy.too_small(len(self.cohort["patients"]), self.cohort["alpha"])
            check = ((f"In-distribution check: never flags: {small}", True) if small else
                     (f"In-distribution check: against the anatomy and CT of the {len(self.cohort['patients'])} "
                      f"training patients (a conformal p-value below {self.cohort['alpha']:g}: {OUTSIDE})", False))
        return [self._bands_line(), check]

    @property
    def gives_bands(self) -> bool:
        """Whether some structure-metric has residuals enough for a band at :attr:`coverage`."""
        return self.bands is not None and not self._bands_line()[1]

    def _bands_line(self) -> tuple[str, bool]:
        if self.bands is None:
            return f"No prediction bands: {self.why_no_bands}", True
        most = max((len(values) for metrics in self.bands["residuals"].values() for values in metrics.values()),
                   default=0)
        needed = calibration.patients_needed(self.coverage)
        if most < needed:  # every structure-metric is without: said once, not on each table
            return (f"No prediction bands at {100 * self.coverage:g} % nominal coverage: a metric's residuals come "
                    f"from {most} training patients at most, {needed} are needed (--band "
                    f"{math.floor(100 * calibration.largest_coverage(most)) / 100:.2f} or lower gives bands)", True)
        return (f"Bands: {100 * self.coverage:g} % nominal coverage, {calibration.METHOD} of "
                f"{self.bands['patients']} training patients", False)


def described(description: str, checked: dict | None, uncommissioned: bool = False) -> str:
    """An RT Dose's series description, begun with "Outside the training cohort: " for a flagged
    patient, or "Uncommissioned model: " when the prediction carries neither bands nor the check
    (:attr:`Trust.uncommissioned`; first: a description is cut to 64 characters), so the planner sees
    it in the planning system."""
    if uncommissioned:
        return f"{UNCOMMISSIONED[0].upper()}{UNCOMMISSIONED[1:]}: {description[:1].lower()}{description[1:]}"
    if checked is None or checked["inside"]:
        return description
    return f"{OUTSIDE[0].upper()}{OUTSIDE[1:]}: {description[:1].lower()}{description[1:]}"


def flag_line(checked: dict) -> str:
    """An in-distribution check's outcome in one line (:meth:`Trust.in_distribution`'s dict, or
    the journal's copy of it)."""
    if checked.get("p_value") is None:  # a journal entry of a check before the conformal p-value
        return f"{OUTSIDE[0].upper()}{OUTSIDE[1:]}" + (": " + "; ".join(checked.get("reasons") or []))
    p = f"p = {checked['p_value']:.3f}, alpha {checked['alpha']:g}"
    if checked["inside"]:
        small = checked.get("too_small")
        return f"In the training cohort ({p})" + (f"; the check cannot flag: {small}" if small else "")
    feature = f"flagged by {checked['feature']}" if checked.get("feature") else "flagged"
    reasons = "; ".join(checked["reasons"]) or "no single feature stands out: the combination does"
    return f"{OUTSIDE[0].upper()}{OUTSIDE[1:]} ({p}; {feature}): {reasons}"


def band_lines(band: dict, predicted: Mapping[str, Mapping[str, float]], metrics: Iterable[str]) -> list[str]:
    """A predicted DVH table with its band (:meth:`Trust.band`'s dict), a line per structure:
    ``PTV70: D99 66.1 (63.0 to 68.2), ... Gy``."""
    metrics = list(metrics)
    lines = [f"Bands ({100 * band['coverage']:g} % nominal; {band['method']}):"]
    for structure, values in predicted.items():
        cells = []
        for metric in metrics:
            if metric not in values:
                continue
            low, high = band["low"][structure].get(metric), band["high"][structure].get(metric)
            cells.append(f"{metric} {values[metric]:.1f}" + (f" ({low:.1f} to {high:.1f})" if low is not None else
                                                              " (no band)"))
        lines.append(f"  {structure}: {', '.join(cells)} Gy")
    return lines


def no_trust(model: str, coverage: float, why: str) -> Trust:
    """A model whose predictions carry neither bands nor the check, for the reason ``why``."""
    return Trust(model, coverage, why_no_bands=why, why_no_check=why)


def load_trust(model_dir: os.PathLike | str, used: Iterable[tuple[RunFolder, int, str, Path]],
               coverage: float = calibration.DEFAULT_COVERAGE) -> Trust:
    """What the predictions of ``model_dir``'s model carry when it predicts with ``used``: each
    ``(run folder, epoch, SHA-256 of its checkpoint, the checkpoint file)`` it predicts with (a
    :class:`~provided_code.deployed_model.DeployedModel`'s members, :meth:`~provided_code.deployed_model.DeployedModel.trust`). Bands when those are all the folds of the
    cross-validated model in ``model_dir``, each at the checkpoint commissioning assessed; the
    check when they are its folds at any checkpoints (module docstring). ``coverage``: the bands'
    nominal coverage, checked (a ValueError in the package's style). A commissioning file that is
    there but unreadable is a :class:`TrustError`."""
    coverage = calibration.check_coverage(coverage)
    model_dir = Path(model_dir)
    used = list(used)
    name = model_dir.name
    folds = fold_members(model_dir)
    if folds is None and fold_of_folder(model_dir) is not None and fold_members(model_dir.parent) is not None:
        return no_trust(name, coverage, f"{name} is one fold of {model_dir.parent.name}: its commissioning assesses "
                                        f"the folds together (predict with {model_dir.parent})")
    if folds is None:
        return no_trust(name, coverage, f"{name} is a single run, not a cross-validated model: bands and the check "
                                        f"are calibrated on the out-of-fold predictions of a model's folds (train it "
                                        f"with --folds N --fold K, then run openkbp-commission)")
    wanted = {path.resolve() for path in folds}
    got = {folder.path.resolve() for folder, *_ in used}
    if got != wanted:
        return no_trust(name, coverage, f"the prediction is made with {len(got)} model(s), not the {len(folds)} folds "
                                        f"of {name} together: its commissioning assesses those")
    folder = commissioning_folder(model_dir)
    command = f"run openkbp-commission {model_dir}"
    cohort = _read(folder / COHORT_FILE, command)
    bands = _read(folder / BANDS_FILE, command)
    if bands is None and cohort is None:
        return no_trust(name, coverage, f"{name} is not commissioned (no {folder / BANDS_FILE}): {command}")
    why_no_check = "" if cohort is not None else f"{folder / COHORT_FILE} is missing: {command} again"
    if cohort is not None and cohort.get("format") != anatomy.COHORT_FORMAT:
        why_no_check = (f"{folder / COHORT_FILE} is of an earlier check (format {cohort.get('format')!r}, not "
                        f"{anatomy.COHORT_FORMAT}: no calibrated p-value): {command} again")
        cohort = None
    if bands is None:
        why_no_bands = f"{name} was commissioned before bands existed (no {folder / BANDS_FILE}): {command} again"
    else:
        why_no_bands = _checked_bands(bands, folder / BANDS_FILE, used, command)
    return Trust(name, coverage, bands=bands if not why_no_bands else None, cohort=cohort,
                 why_no_bands=why_no_bands, why_no_check=why_no_check)


def _checked_bands(bands: dict, path: Path, used: list[tuple[RunFolder, int, str, Path]], command: str) -> str:
    """Why ``bands`` do not apply to the checkpoints ``used`` ('' when they do): each fold at
    another epoch than commissioned, or whose file (``best.keras`` under ``--epoch best``, one
    trained again or replaced) has another SHA-256 than the one the commissioning measured."""
    if bands.get("format") != BANDS_FORMAT or not isinstance(bands.get("residuals"), dict):
        raise TrustError(f"{path}: not a bands file of format {BANDS_FORMAT} (format {bands.get('format')!r}): "
                         f"{command} again")
    commissioned = {entry["fold"]: entry for entry in bands.get("folds", [])}
    differ = []
    for folder, epoch, sha256, checkpoint in used:
        now = {"fold": fold_of_folder(folder.path), "epoch": int(epoch), "sha256": sha256}
        then = commissioned.get(now["fold"])
        if then is None or then["epoch"] != now["epoch"] or then.get("sha256") != now["sha256"]:
            differ.append(f"fold {now['fold']} at epoch {now['epoch']}" + (
                f" (commissioned at epoch {then['epoch']})" if then is not None and then["epoch"] != now["epoch"] else
                f" ({checkpoint}: SHA-256 {sha256[:12]}…, not the {str(then.get('sha256'))[:12]}… its commissioning "
                f"measured)" if then is not None else ""))
    if differ:
        return (f"the bands were calibrated on other checkpoints than those predicting ({'; '.join(differ)}): "
                f"predict with each fold's commissioned checkpoint (the default), or {command} again")
    return ""


def _read(path: Path, command: str) -> dict | None:
    """A commissioning file's content (None: there is none), checked against the SHA-256 its
    commissioning bound it to (:func:`bound_sha256`): one edited since is a :class:`TrustError`."""
    if not path.is_file():
        return None
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, ValueError) as error:
        raise TrustError(f"{path}: unreadable ({error}); run openkbp-commission again") from None
    if not isinstance(data, dict):
        raise TrustError(f"{path}: not a JSON object; run openkbp-commission again")
    recorded = bound_sha256(path.parent, path.name)
    found = hashlib.sha256(raw).hexdigest()
    if recorded is not None and found != recorded:
        raise TrustError(f"{path} changed since the model was commissioned (SHA-256 {found[:12]}…, its "
                         f"{CARD_FILE} records {recorded[:12]}…): a commissioning's files are used as it wrote "
                         f"them; restore it, or {command} again")
    return data


def bound_sha256(folder: os.PathLike | str, name: str) -> str | None:
    """The SHA-256 the commissioning in ``folder`` bound its file ``name`` to (its
    :data:`CARD_FILE`'s :data:`BOUND`); None when it bound none (commissioned before files were
    bound, or no card: nothing to check against)."""
    path = Path(folder) / CARD_FILE
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise TrustError(f"{path}: unreadable ({error}); run openkbp-commission again") from None
    bound = card.get(BOUND) if isinstance(card, dict) else None
    return bound.get(name) if isinstance(bound, dict) else None
