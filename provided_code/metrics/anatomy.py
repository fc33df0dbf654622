"""How unlike the training cohort a patient's anatomy and CT are: features computed once per
patient, one nonconformity score, its conformal p-value against the cohort's leave-one-out scores,
and the features that drive it in a physicist's words.

**Features** (:func:`anatomy_features`, in the order of :func:`feature_names`, stable for a site):

1. ``<structure>.volume_cc`` for each structure of the site, in channel order: its volume in cc
   (NaN when the patient does not have the structure);
2. ``<organ>.within_<d>mm`` for each organ at risk and d in 0, 5, 10, 20: the fraction of the
   organ's voxels whose centre lies within d mm of the centre of a target voxel (any target; 0 mm:
   inside a target), the overlap-volume histogram of the organ with the targets at four distances
   (NaN when the organ is absent; 0 when the patient has no target);
3. ``body.<axis>_mm`` for the axes anterior_posterior, right_left, superior_inferior: the body's
   extent (the possible-dose mask's, which is the body), first to last voxel, in mm;
4. ``ct.p<q>_hu`` for q in 5, 25, 50, 75, 95: the CT's percentiles inside the body, in HU (the
   CT is an input of the model: a scanner miscalibrated by +300 HU, or a synthetic CT, changes them).

Distances are exact Euclidean distances in mm with the patient's anisotropic voxel size: a
separable squared-distance transform of the targets (one axis at a time, each voxel taking the
least of its neighbours' values plus the squared offset), with every offset up to 20 mm along
each axis. A target voxel within 20 mm of an organ voxel differs from it by at most 20 mm along
each axis, so it is among the candidates: every distance up to 20 mm is exact, a larger one is
only known to be larger. Only the organs' bounding box widened by 20 mm is transformed. On the 20
real OpenKBP training patients of the project's sample (128³, 3.9 to 4.9 mm × 2.5 to 3 mm voxels)
a patient's features took 8 to 28 ms (median 12 ms) on one core of the shared 2-core machine, and
matched a brute-force search over every pair of organ and target voxels exactly.

**The nonconformity score** (:func:`nonconformity`) of a patient against a set of training
patients is a sum over the features of how unlike theirs its value is:

- a value: how far it lies beyond the training patients' range (0 within it), in robust scales
  (1.4826 × the MAD of their values; 1.2533 × the mean absolute deviation when the MAD is 0),
  never less than :func:`scale_floor` (a twentieth of an organ for an overlap fraction, a tenth of
  the median volume and at least 1 cc for a volume, 10 mm for the body's extent, 10 HU for the CT:
  an overlap a fraction of a percent beyond the others', where most patients have none, is not
  outside);
- a structure the patient lacks that at least half of the m training patients have:
  log((m + 1) / (lacking + 1)), ``lacking`` the training patients without it (a parotid every
  other patient has adds log(m + 1), 4.0 at 54; one that 4 of them lack, 2.4); a structure none
  of them has, log(m + 1).

A sum rather than the largest part: an anatomy that is unusual in several features at once (a
grown target swallowing organs: its volume and several organs' overlaps) adds them up, and on the
project's 55 real patients it found more of the altered ones than the maximum did at the same
false-flag rate (the rate is the p-value's, whatever the score: docs/trust.md). Missing structures
count by their rarity among the training patients, not by a volume of 0 cc: a real cohort has
patients lacking a parotid or the brainstem, and a patient lacking one is as unusual as few of
them are.

**The p-value** (:func:`p_value`) is conformal (Vovk et al. 2005; Bates et al., Annals of
Statistics 2023): each training patient is scored leave-one-out, against the others only
(:func:`left_out_scores`), and a new patient's score s against all of them gives
p = (1 + #{cohort scores ≥ s}) / (n + 1). A new patient exchangeable with the training patients
has a score exchangeable with their leave-one-out scores (each is scored against n − 1 or n
others: nearly the same, the leave-one-out and "jackknife" variants of Barber et al. 2021 and
Hennhöfer and Preisach 2024), so P(p < α) ≤ α: a patient like the cohort is flagged
(:func:`check`, ``inside`` False) at most α of the time, whatever the features' distributions.
Below the alpha it is "flagged", the reasons saying which feature added most. A cohort of n
patients cannot flag at α when 1/(n + 1) ≥ α (:func:`too_small`: 19 patients or fewer at 0.05).
Each training patient's own p-value (:func:`cohort_scores`) is against the other n − 1
patients' scores.

**Reasons**: the features that drive a score, in words: the one adding most to the score first
(its ``feature``: for a flagged
patient, what flagged it), then those outside the range (by how far, in robust scales;
said with the cohort's furthest value), then those within it with the largest robust z (said
against the cohort's median: an overlap's range, often 0 % to 100 %, says nothing of "more than
most"); at most three. A percent is never "-0 %".

numpy only (no scipy); no file I/O: the cohort is a JSON-able dict the caller saves.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd

from provided_code.constants import CT_HU_OFFSET
from provided_code.errors import UserError
from provided_code.metrics.calibration import open_fraction
from provided_code.metrics.commissioning import MAD_SCALE
from provided_code.sites import Site

OVH_DISTANCES_MM = (0, 5, 10, 20)  # the overlap-volume histogram's distances, mm
AXES = ("anterior_posterior", "right_left", "superior_inferior")  # the volume's axes (provided_code.constants)
DEFAULT_ALPHA = 0.05  # the flag's level: a patient like the cohort is flagged at most this often
NOTABLE_Z = 2.0  # a feature within the cohort's range is a reason from this robust z on
OUTSIDE_SCALES = 0.1  # a feature counts as outside the cohort's range from this many robust scales beyond it
FAR_SCALES = 1.0  # ... and as far outside from this many
CT_PERCENTILES = (5, 25, 50, 75, 95)  # the CT's features: these percentiles of HU inside the body
MOST_REASONS = 3
COHORT_FORMAT = 2  # 1: a local outlier factor (before the conformal p-value)
METHOD = ("conformal p-value of a nonconformity score (the features' distances beyond the others' range, "
          "missing structures) against the training patients' leave-one-out scores")
_MEAN_DEVIATION_SCALE = 1.2533  # sqrt(π/2): the mean absolute deviation of a normal sample times this is its SD
_DISTANCE_TOLERANCE_MM2 = 1e-6  # squared distances are sums of squared multiples of the spacing: equal to a
# distance's square up to float rounding, far below this
_ABSENT_CC = 1e-6  # a volume read back from a standardised vector below this was an absent structure's 0 cc
_FEATURE = re.compile(r"^(?P<structure>.+)\.(?:(?P<volume>volume_cc)|within_(?P<within>\d+)mm|(?P<axis>[a-z_]+)_mm|p(?P<percentile>\d+)_hu)$")


def feature_names(site: Site) -> tuple[str, ...]:
    """The features of a patient of ``site``, in :func:`anatomy_features`' order."""
    return (*(f"{name}.volume_cc" for name in site.names),
            *(f"{organ}.within_{distance}mm" for organ in site.oars for distance in OVH_DISTANCES_MM),
            *(f"body.{axis}_mm" for axis in AXES),
            *(f"ct.p{percentile}_hu" for percentile in CT_PERCENTILES))


def anatomy_features(structure_masks: np.ndarray, possible_dose_mask: np.ndarray, voxel_dimensions,
                     site: Site, ct: np.ndarray | None = None) -> dict[str, float]:
    """One patient's features (module docstring), ``{name: value}`` in :func:`feature_names` order.

    ``structure_masks``: the packed volume (bit k = ``site.names[k]``); ``possible_dose_mask``: the
    body, same shape; ``voxel_dimensions``: mm along the three axes of these volumes; ``ct``: the
    CT's grey values (HU + :data:`~provided_code.constants.CT_HU_OFFSET`), same shape (None: its
    features NaN, left out of the score)."""
    masks = np.asarray(structure_masks)
    body = np.asarray(possible_dose_mask, dtype=bool)
    spacing = np.asarray(voxel_dimensions, dtype=np.float64).reshape(3)
    if masks.ndim != 3 or body.shape != masks.shape:
        raise ValueError(f"Invalid volumes. Expected structure_masks and possible_dose_mask of one 3-D shape. "
                         f"Received: {masks.shape} and {body.shape}")
    voxel_cc = float(np.prod(spacing)) / 1000.0
    occupied = np.flatnonzero(masks)
    bits = masks.reshape(-1)[occupied]
    voxels = {name: occupied[(bits >> k) & 1 == 1] for k, name in enumerate(site.names)}
    features = {f"{name}.volume_cc": (voxels[name].size * voxel_cc if voxels[name].size else math.nan)
                for name in site.names}

    organs = [name for name in site.oars if voxels[name].size]
    targets = (masks & np.asarray(site.target_bits, dtype=masks.dtype)) != 0
    squared = None
    if organs and targets.any():
        box = _box_around(np.concatenate([voxels[name] for name in organs]), masks.shape, spacing,
                          max(OVH_DISTANCES_MM))
        squared = np.full(masks.shape, np.inf)
        squared[box] = squared_distance_to(targets[box], spacing, max(OVH_DISTANCES_MM))
        squared = squared.reshape(-1)
    for organ in site.oars:
        if not voxels[organ].size:
            fractions = [math.nan] * len(OVH_DISTANCES_MM)
        elif squared is None:  # no target: nothing is within any distance of one
            fractions = [0.0] * len(OVH_DISTANCES_MM)
        else:
            found = squared[voxels[organ]]
            fractions = [float(np.mean(found <= distance ** 2 + _DISTANCE_TOLERANCE_MM2))
                         for distance in OVH_DISTANCES_MM]
        features.update({f"{organ}.within_{distance}mm": fraction
                         for distance, fraction in zip(OVH_DISTANCES_MM, fractions)})

    for axis, name in enumerate(AXES):
        along = np.flatnonzero(body.any(axis=tuple(a for a in range(3) if a != axis)))
        features[f"body.{name}_mm"] = float((along[-1] - along[0] + 1) * spacing[axis]) if along.size else math.nan
    inside = np.asarray(ct, dtype=np.float64)[body] - CT_HU_OFFSET if ct is not None and body.any() else None
    if inside is not None and np.shape(ct) != masks.shape:
        raise ValueError(f"Invalid `ct`. Expected the shape of the masks {masks.shape}. Received: {np.shape(ct)}")
    found = np.percentile(inside, CT_PERCENTILES) if inside is not None else [math.nan] * len(CT_PERCENTILES)
    features.update({f"ct.p{percentile}_hu": float(value) for percentile, value in zip(CT_PERCENTILES, found)})
    return features


def squared_distance_to(region: np.ndarray, spacing, limit_mm: float) -> np.ndarray:
    """The squared Euclidean distance (mm²) from each voxel's centre to the nearest voxel of the
    bool volume ``region`` (0 inside it), exact up to ``limit_mm``; inf or more than
    ``limit_mm``² beyond (module docstring)."""
    squared = np.where(region, 0.0, np.inf)
    for axis in range(3):
        step = float(spacing[axis])
        result = squared.copy()
        for offset in range(1, int(limit_mm / step + 1e-9) + 1):
            cost = (offset * step) ** 2
            ahead, behind = _sliced(axis, offset, None, 3), _sliced(axis, None, -offset, 3)
            np.minimum(result[behind], squared[ahead] + cost, out=result[behind])
            np.minimum(result[ahead], squared[behind] + cost, out=result[ahead])
        squared = result
    return squared


def _sliced(axis: int, start, stop, ndim: int) -> tuple:
    return tuple(slice(start, stop) if a == axis else slice(None) for a in range(ndim))


def _box_around(flat: np.ndarray, shape, spacing: np.ndarray, margin_mm: float) -> tuple:
    """The bounding box of the flat indices ``flat`` widened by ``margin_mm`` along each axis."""
    coordinates = np.unravel_index(flat, shape)
    box = []
    for axis in range(3):
        widen = int(margin_mm / spacing[axis] + 1e-9)
        box.append(slice(max(0, int(coordinates[axis].min()) - widen),
                         min(shape[axis], int(coordinates[axis].max()) + widen + 1)))
    return tuple(box)


# -- the cohort ------------------------------------------------------------------------------------

def fit_cohort(features: pd.DataFrame, alpha: float = DEFAULT_ALPHA) -> dict:
    """What checking a patient against this cohort needs, JSON-able (NaN as None): ``features``
    (names, in order), ``patients``, ``centre`` and ``scale`` per feature (None: a constant
    feature), ``vectors`` (each patient's standardised features, an absent structure's volume as
    0 cc, None where a feature is missing: the values the reasons and scores read back),
    ``scores`` (each patient's leave-one-out nonconformity score, in ``patients``' order),
    ``alpha`` (the flag's level), ``threshold`` (the least score flagged is above it; None: the
    cohort is too small to flag at ``alpha``), ``method`` and ``format``.

    ``features``: one row per training patient (index: patient id), one column per feature
    (:func:`anatomy_features`' dicts stacked). At least 3 patients."""
    if not isinstance(features, pd.DataFrame):
        raise TypeError(f"Invalid `features`. Expected a pandas DataFrame (index patient, columns features). "
                        f"Received: {type(features).__name__}")
    if len(features) < 3:
        raise ValueError(f"Invalid `features`. Expected at least 3 patients to fit a cohort. Received: {len(features)}")
    alpha = check_alpha(alpha)
    names = [str(name) for name in features.columns]
    measured = features.to_numpy(dtype=np.float64)
    values = _for_distance(names, measured)
    with warnings.catch_warnings():  # a feature missing in every patient has no median: left out
        warnings.simplefilter("ignore", RuntimeWarning)
        centre = np.nanmedian(values, axis=0)
        deviation = np.abs(values - centre)
        scale = MAD_SCALE * np.nanmedian(deviation, axis=0)
        fallback = _MEAN_DEVIATION_SCALE * np.nanmean(deviation, axis=0)
    scale = np.where(scale > 0, scale, np.where(fallback > 0, fallback, np.nan))
    scores = left_out_scores(names, measured)
    return {"format": COHORT_FORMAT, "method": METHOD,
            "features": names, "patients": [str(patient) for patient in features.index],
            "centre": _json_list(centre), "scale": _json_list(scale),
            "vectors": [_json_list(row) for row in (values - centre) / scale],
            "scores": [float(value) for value in scores], "alpha": alpha,
            "threshold": threshold_of(scores, alpha)}


class AlphaError(UserError, ValueError):
    """An in-distribution check's level that is no fraction strictly between 0 and 1 (``--alpha``)."""


def check_alpha(alpha) -> float:
    """``alpha`` as a float strictly between 0 and 1 (not NaN), or an :class:`AlphaError` in the
    package's style."""
    value = open_fraction(alpha)
    if value is None:
        raise AlphaError(f"Invalid `alpha`. Expected the flag's level, a fraction between 0 and 1 (0.05: a patient "
                         f"like the cohort is flagged at most 5 % of the time). Received: {alpha!r}")
    return value


def p_value(score_value: float, scores) -> float:
    """The conformal p-value of a patient's nonconformity score against the cohort's leave-one-out
    scores: (1 + #{cohort scores >= score}) / (n + 1). For a patient exchangeable with the cohort
    it is uniform over 1/(n + 1), ..., 1 (ties aside: then larger), so P(p < α) ≤ α."""
    scores = np.asarray(scores, dtype=np.float64)
    return float((1 + np.count_nonzero(scores >= score_value)) / (scores.size + 1))


def can_flag(patients: int, alpha: float) -> bool:
    """Whether a cohort of ``patients`` can ever flag at ``alpha``: its least p-value, 1/(n + 1),
    below it (n > 1/α − 1: 20 patients at 0.05)."""
    return 1.0 / (patients + 1) < alpha * (1 - 1e-12)


def too_small(patients: int, alpha: float) -> str:
    """Why a cohort of ``patients`` never flags at ``alpha`` ('' when it can)."""
    if can_flag(patients, alpha):
        return ""
    needed = math.floor(1 / alpha - 1 + 1e-9) + 1  # the least n with 1/(n + 1) < alpha
    return (f"a cohort of {patients} training patients cannot flag at alpha {alpha:g}: its smallest p-value is "
            f"1/{patients + 1} = {1 / (patients + 1):.3f}; {needed} patients are needed, or a larger alpha")


def threshold_of(scores, alpha: float) -> float | None:
    """The score a patient must exceed to be flagged at ``alpha`` (p < α), from the cohort's
    leave-one-out scores: the (K + 1)-th largest, K the most cohort scores at or above a flagged
    patient's (the largest integer below α(n + 1) − 1). None: none can be flagged."""
    scores = np.sort(np.asarray(scores, dtype=np.float64))[::-1]
    allowed = math.ceil(alpha * (scores.size + 1) - 1 - 1e-9) - 1  # K
    if allowed < 0:
        return None
    return float(scores[allowed]) if allowed < scores.size else -math.inf


def nonconformity(names, row: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Each feature's part of a patient's nonconformity score (module docstring) against the
    patients ``others`` (rows as measured: NaN where missing): how far beyond the others' range,
    in robust scales of at least :func:`scale_floor`; a missing structure that at least half of
    them have, log((m + 1) / (lacking + 1)); a structure none of them has, log(m + 1). The score
    is their sum."""
    parts = np.zeros(len(names))
    m = len(others)
    for column, name in enumerate(names):
        value, seen = row[column], others[:, column]
        present = seen[~np.isnan(seen)]
        if name.endswith(".volume_cc"):
            if np.isnan(value):
                if present.size and present.size >= 0.5 * m:
                    parts[column] = math.log((m + 1) / (m - present.size + 1))
                continue
            if not present.size:
                parts[column] = math.log(m + 1)
                continue
        if np.isnan(value) or present.size < 2:
            continue
        centre = float(np.median(present))
        spread = max(_robust_scale(present, centre), scale_floor(name, centre))
        parts[column] = max(value - float(present.max()), float(present.min()) - value, 0.0) / spread
    return parts


def left_out_scores(names, measured: np.ndarray) -> np.ndarray:
    """Each patient's nonconformity score against the others only (leave-one-out): ``measured``
    as the features were measured (NaN where missing), a row per patient."""
    everyone = np.arange(len(measured))
    return np.array([nonconformity(names, measured[patient], measured[np.delete(everyone, patient)]).sum()
                     for patient in everyone])


def _robust_scale(values: np.ndarray, centre: float) -> float:
    deviation = np.abs(values - centre)
    scale = MAD_SCALE * float(np.median(deviation))
    return scale if scale > 0 else _MEAN_DEVIATION_SCALE * float(np.mean(deviation))


def scale_floor(name: str, centre: float) -> float:
    """The least scale a feature's distance beyond the cohort's range is measured in (module
    docstring): 0.05 for an overlap fraction, a tenth of the median volume (at least 1 cc), 10 mm
    for the body's extent, 10 HU for the CT."""
    parts = _FEATURE.match(name)
    if parts and parts["within"] is not None:
        return 0.05
    if parts and parts["volume"]:
        return max(0.1 * abs(centre), 1.0) if np.isfinite(centre) else 1.0
    return 10.0


def check(cohort: dict, features_row) -> dict:
    """A new patient's in-distribution check (module docstring): ``score`` (its nonconformity
    score), ``p_value`` against the cohort's leave-one-out scores, ``alpha``, ``inside`` (False:
    p < alpha, outside the training cohort), ``threshold`` (the least score flagged is above it;
    None: the cohort cannot flag, ``too_small`` says why), ``feature`` (the feature adding most
    to the score) and ``reasons`` (in words, the flagged feature's first)."""
    names = cohort["features"]
    raw = np.array([_number(features_row.get(name)) for name in names], dtype=np.float64)
    cohort_raw = _raw(cohort)
    parts = nonconformity(names, raw, cohort_raw)
    alpha = float(cohort["alpha"])
    found = float(parts.sum())
    p = p_value(found, cohort["scores"])
    feature = names[int(np.argmax(parts))] if parts.max() > 0 else None
    return {"inside": bool(p >= alpha), "score": found, "p_value": p, "alpha": alpha,
            "threshold": cohort["threshold"], "feature": feature,
            "too_small": too_small(len(cohort["scores"]), alpha),
            "reasons": _reasons(cohort, raw, np.arange(len(cohort_raw)), first=feature)}


def cohort_scores(cohort: dict) -> pd.DataFrame:
    """Each training patient scored leave-one-out, against the others only: index ``patient``,
    columns ``score``, ``p_value`` (against the other patients' leave-one-out scores), ``flagged``
    (p below the cohort's alpha) and ``reasons`` (a list of sentences)."""
    raw = _raw(cohort)
    scores = np.asarray(cohort["scores"], dtype=np.float64)
    alpha = float(cohort["alpha"])
    rows = []
    everyone = np.arange(len(raw))
    for patient, found in enumerate(scores):
        others = np.delete(everyone, patient)
        p = p_value(found, scores[others])
        parts = nonconformity(cohort["features"], raw[patient], raw[others])
        feature = cohort["features"][int(np.argmax(parts))] if parts.max() > 0 else None
        rows.append({"patient": cohort["patients"][patient], "score": float(found), "p_value": p,
                     "flagged": bool(p < alpha), "feature": feature,
                     "reasons": _reasons(cohort, raw[patient], others, first=feature)})
    return pd.DataFrame(rows).set_index("patient")


def _for_distance(names, values: np.ndarray) -> np.ndarray:
    """Feature values as the standardised vectors hold them: an absent structure's volume 0 cc."""
    values = values.copy()
    volumes = [column for column, name in enumerate(names) if name.endswith(".volume_cc")]
    values[:, volumes] = np.nan_to_num(values[:, volumes], nan=0.0)
    return values


def _raw(cohort: dict) -> np.ndarray:
    """The cohort's feature values as measured (absent volumes NaN again), from its vectors."""
    centre, scale = _array(cohort["centre"]), _array(cohort["scale"])
    raw = _array(cohort["vectors"]) * scale + centre
    constant = np.isnan(scale)
    raw[:, constant] = centre[constant]
    volumes = [column for column, name in enumerate(cohort["features"]) if name.endswith(".volume_cc")]
    raw[:, volumes] = np.where(np.abs(raw[:, volumes]) < _ABSENT_CC, np.nan, raw[:, volumes])
    return raw


# -- reasons ---------------------------------------------------------------------------------------

def _reasons(cohort: dict, raw: np.ndarray, others: np.ndarray, first: str | None = None) -> list[str]:
    """The features of a patient (``raw``: as measured, NaN where missing) that drive its score,
    against the cohort's patients ``others``, in words, at most :data:`MOST_REASONS`: a structure
    the patient lacks and half of them have (as the score counts it), or has and none of them has;
    a value outside their range by more than :data:`OUTSIDE_SCALES` robust scales (by how far); a
    value within it :data:`NOTABLE_Z` robust scales or more from the median (by how far): scales of
    at least :func:`scale_floor`, as the score measures. ``first``: the feature adding most to the
    score, said first."""
    names, centre, scale = cohort["features"], _array(cohort["centre"]), _array(cohort["scale"])
    cohort_raw = _raw(cohort)[others]
    found = []  # (scales beyond the range, robust z, subject, sentence)
    for column, name in enumerate(names):
        value, seen = raw[column], cohort_raw[:, column]
        if name.endswith(".volume_cc"):
            having = np.count_nonzero(~np.isnan(seen))
            structure = name[:-len(".volume_cc")]
            if np.isnan(value):
                if having and having >= 0.5 * len(seen):
                    found.append((FAR_SCALES, 0.0, name, f"{structure} is absent (not contoured); {having} of the "
                                                   f"{len(seen)} training patients have it"))
                continue
            if not having:
                found.append((math.inf, 0.0, name, f"{structure} is present ({_cc(value)}); no training patient has it"))
                continue
        if np.isnan(value) or np.all(np.isnan(seen)):
            continue
        low, high = float(np.nanmin(seen)), float(np.nanmax(seen))
        if np.isfinite(scale[column]):  # in scales of at least scale_floor, as the score measures them
            spread = max(scale[column], scale_floor(name, centre[column]))
            z = abs(value - centre[column]) / spread
        else:  # the same value in every patient: any other is outside, by its distance relative to that value
            spread, z = max(abs(high), abs(value - high)) or 1.0, 0.0
        beyond = max(value - high, low - value, 0.0) / spread
        if beyond > OUTSIDE_SCALES:
            found.append((beyond, z, _subject(name), _sentence(name, value, low, high, "above" if value > high else "below",
                                               beyond >= FAR_SCALES, centre[column])))
        elif z >= NOTABLE_Z:
            found.append((0.0, z, _subject(name), _sentence(name, value, low, high, "high" if value > centre[column] else "low",
                                            False, centre[column])))
    found.sort(key=lambda item: (item[2] == (_subject(first) if first else None), item[0], item[1]), reverse=True)
    reasons, said = [], set()
    for *_, subject, sentence in found:  # one reason per organ's overlap (its four distances say one thing)
        if subject not in said:
            said.add(subject)
            reasons.append(sentence)
    return reasons[:MOST_REASONS]


def _subject(name: str) -> str:
    """What a feature is about: an organ's overlap features share one (``Parotid.within``)."""
    parts = _FEATURE.match(name)
    return f"{parts['structure']}.within" if parts and parts["within"] is not None else name


def _sentence(name: str, value: float, low: float, high: float, where: str, far: bool, median: float) -> str:
    """A feature's value in words: ``where`` is ``above`` or ``below`` the cohort's range (said with
    the cohort's furthest value), or ``high`` or ``low`` within it (said with the cohort's
    ``median``: its range, often 0 % to 100 % for an overlap, says nothing of "more than most")."""
    parts = _FEATURE.match(name)
    structure = parts["structure"] if parts else name
    more = where in ("above", "high")
    extreme = ("largest" if more else "smallest")
    if parts and parts["volume"]:
        if where in ("above", "below"):
            return f"{structure} volume {_cc(value)}; the training cohort's {extreme} was {_cc(high if more else low)}"
        return (f"{structure} volume {_cc(value)}, {'larger' if more else 'smaller'} than most of the training "
                f"cohort's (their median {_cc(median)})")
    if parts and parts["within"] is not None:
        distance = int(parts["within"])
        place = "inside a target" if distance == 0 else f"within {distance} mm of a target"
        if where in ("above", "below"):
            return (f"{structure} overlaps the targets {'far ' if far else ''}{'more' if more else 'less'} than in any "
                    f"training patient ({_percent(value)} {place}; the cohort's {'most' if more else 'least'} was "
                    f"{_percent(high if more else low)})")
        return (f"{structure} overlaps the targets {'more' if more else 'less'} than most training patients "
                f"({_percent(value)} {place}; the cohort's median {_percent(median)})")
    if parts and parts["percentile"] is not None:
        what = "median" if parts["percentile"] == "50" else f"{parts['percentile']}th percentile"
        bound = ("highest" if more else "lowest") if where in ("above", "below") else None
        if bound:
            return (f"the CT's {what} inside the body is {_hu(value)}; the training cohort's {bound} was "
                    f"{_hu(high if more else low)}")
        return (f"the CT's {what} inside the body is {_hu(value)}, {'higher' if more else 'lower'} than most of "
                f"the training cohort's (their median {_hu(median)})")
    if parts and parts["axis"]:
        axis = parts["axis"].replace("_", "-")
        if where in ("above", "below"):
            return f"the body spans {_mm(value)} {axis}; the training cohort's {extreme} was {_mm(high if more else low)}"
        return (f"the body spans {_mm(value)} {axis}, {'more' if more else 'less'} than most of the training "
                f"cohort's (their median {_mm(median)})")
    return f"{name} {value:.4g}; the training cohort's {low:.4g} to {high:.4g}"


def _cc(value: float) -> str:
    return f"{value:,.0f} cc" if value >= 100 else f"{value:.1f} cc" if value >= 1 else f"{value:.2f} cc"


def _mm(value: float) -> str:
    return f"{value:,.0f} mm"


def _hu(value: float) -> str:
    """HU as a whole number, never "-0 HU"."""
    return f"{round(value):,} HU"


def _percent(fraction: float) -> str:
    """A fraction as a whole percent, never "-0 %" (a fraction read back from the standardised
    vectors may be a rounding below 0)."""
    return f"{round(min(max(100 * fraction, 0.0), 100.0))} %"


# -- JSON ------------------------------------------------------------------------------------------

def _number(value) -> float:
    return math.nan if value is None else float(value)


def _array(values) -> np.ndarray:
    """A JSON list (None for NaN) as float64."""
    return np.array(values, dtype=np.float64)


def _json_list(values: np.ndarray) -> list:
    return [None if not np.isfinite(v) else float(v) for v in np.asarray(values, dtype=np.float64)]
