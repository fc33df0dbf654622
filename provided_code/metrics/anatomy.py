"""How unlike the training cohort a patient's anatomy is: features computed once per patient, a
local outlier factor against the cohort, and the features that drive it in a physicist's words.

**Features** (:func:`anatomy_features`, in the order of :func:`feature_names`, stable for a site):

1. ``<structure>.volume_cc`` for each structure of the site, in channel order: its volume in cc
   (NaN when the patient does not have the structure);
2. ``<organ>.within_<d>mm`` for each organ at risk and d in 0, 5, 10, 20: the fraction of the
   organ's voxels whose centre lies within d mm of the centre of a target voxel (any target; 0 mm:
   inside a target), the overlap-volume histogram of the organ with the targets at four distances
   (NaN when the organ is absent; 0 when the patient has no target);
3. ``body.<axis>_mm`` for the axes anterior_posterior, right_left, superior_inferior: the body's
   extent (the possible-dose mask's, which is the body), first to last voxel, in mm.

Distances are exact Euclidean distances in mm with the patient's anisotropic voxel size: a
separable squared-distance transform of the targets (one axis at a time, each voxel taking the
least of its neighbours' values plus the squared offset), with every offset up to 20 mm along
each axis. A target voxel within 20 mm of an organ voxel differs from it by at most 20 mm along
each axis, so it is among the candidates: every distance up to 20 mm is exact, a larger one is
only known to be larger. Only the organs' bounding box widened by 20 mm is transformed. On the 20
real OpenKBP training patients of the project's sample (128³, 3.9 to 4.9 mm × 2.5 to 3 mm voxels)
a patient's features took 8 to 28 ms (median 12 ms) on one core of the shared 2-core machine, and
matched a brute-force search over every pair of organ and target voxels exactly.

**The cohort** (:func:`fit_cohort`): each feature is standardised robustly, (value − median) /
(1.4826 · MAD) across the training patients (the MAD's normal-consistent scale; when more than
half the patients share a value and the MAD is 0, 1.2533 × the mean absolute deviation from the
median; a feature with the same value in every patient is left out of the distances: it says
nothing about spread). Missing structures are handled explicitly: an absent structure's volume
counts as 0 cc (no contour is no volume: a patient lacking a structure the others have is that
much unlike them, and patients that lack it alike are alike), and an absent organ's overlap
fractions are left out of the distance between two patients: the distance is Euclidean over the
features both patients have, scaled by sqrt(features / features in common) (a "nan-Euclidean"
distance), so an organ's absence counts once, through its volume.

**The score** is the local outlier factor (Breunig et al., 2000): the mean local reachability
density of the patient's k nearest training patients over its own; about 1 inside the cohort (a
patient as densely surrounded as its neighbours are), larger the more isolated it is. It compares
a patient with its neighbourhood rather than with one centre, so a cohort of several kinds of
anatomy (patients with and without a PTV63, a larynx contoured or not) is not one cloud whose
members all look far from its mean, as a Mahalanobis distance would have them. k is 20 (Breunig
et al. found 10 to 20 stable), a third of the cohort in a cohort smaller than 61. The distance is
of order 4 (the fourth root of the sum of fourth powers, over the features in common, scaled as
above) rather than Euclidean: among 41 features a single one far off (a PTV three times the
largest seen, an organ inside the targets) is diluted by the others' noise in a Euclidean distance;
the fourth power lets it weigh (on synthetic cohorts of 200, a feature 6 robust scales off gave a
factor of 1.43 against a 95th percentile of ordinary patients of 1.22; the Euclidean distance, 1.27
against 1.17). Training patients are scored leave-one-out (:func:`cohort_scores`): against the
others only, their neighbourhoods and densities recomputed without the patient; the
standardisation is the whole cohort's (the median and MAD hardly move by one patient: that is what
makes them robust).

**The threshold** is the 95th percentile of the cohort's own leave-one-out scores (never below
:data:`MIN_THRESHOLD`, so a cohort of near-identical patients does not flag noise). The local
outlier factor has no distribution to read a quantile from: its spread depends on the features, k
and the cohort's shape (its tail is heavier than a log-normal's: a normal-theory cut at the median
plus 1.645 robust scales of the log-scores flagged 15 to 25 % of homogeneous synthetic cohorts).
A leave-one-out score is distributed as a new patient's from the same population would be, so
this threshold flags 5 % of the training patients and about 5 % of new patients like them (3 to
9 % of 150 new patients of homogeneous synthetic cohorts of 30 to 340); a flag reads "less typical
than 95 % of the training patients, each judged against the others". A cohort with a few patients
far from the rest flags them (they are the top of the scores); one with more than 5 % unlike the
rest raises the threshold into them, which the report shows beside the scores.

**Reasons**: the features that drive a score, worded with the cohort's range: those outside it
first (by how far, in robust scales), then those with the largest robust z; at most three.

**Outside the cohort** (:func:`check` for a new patient, :func:`cohort_scores` for each training
patient against the others): when its local outlier factor is above the cohort's threshold, *or*
when a feature lies at least :data:`FAR_SCALES` robust scale beyond every (other) training
patient's value (:func:`outside_range`: "the training cohort's largest was ..."), the scale taken
at least :func:`scale_floor` (a twentieth of an organ for an overlap fraction, a tenth of the
median volume and at least 1 cc for a volume, 10 mm for the body's extent: an overlap a fraction
of a percent beyond the others', where most patients have none, is not outside). On the planted
cohort a parotid contour drawn over the neck (173 cc where the others' largest was 50 cc, 11
scales beyond) scored a local outlier factor of 3.2, under that threshold: the second rule finds it. The second rule is the literal meaning of "outside the cohort", and it is not diluted by
the other features as a density is: on the project's planted cohort (55 real patients, four of them
unlike the rest, which put the threshold's 95th percentile among them, at 3.6), the demo's
head-and-neck phantoms (spinal cords and oesophagi longer than any patient's) scored local outlier
factors of 1.7 to 2.7, within the spread of real held-out patients (up to 1.9), but lay 1.1 to 6.2
robust scales beyond the cohort's range, where the real held-out patients lay at most 0.7 (but the
one also above the threshold). A structure the patient lacks counts in the score (its volume 0 cc),
not in the range; so do features the cohort has one value of.

numpy only (no scipy); no file I/O: the cohort is a JSON-able dict the caller saves.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pandas as pd

from provided_code.metrics.commissioning import MAD_SCALE
from provided_code.sites import Site

OVH_DISTANCES_MM = (0, 5, 10, 20)  # the overlap-volume histogram's distances, mm
AXES = ("anterior_posterior", "right_left", "superior_inferior")  # the volume's axes (provided_code.constants)
NEIGHBOURS = 20  # the local outlier factor's k (a third of a cohort smaller than 61)
ORDER = 4  # the distance's order (module docstring: why not 2)
QUANTILE = 0.95  # the threshold: this quantile of the cohort's leave-one-out scores
MIN_THRESHOLD = 1.1  # a local outlier factor at or below this is never flagged
NOTABLE_Z = 2.0  # a feature within the cohort's range is a reason from this robust z on
OUTSIDE_SCALES = 0.1  # a feature counts as outside the cohort's range from this many robust scales beyond it
FAR_SCALES = 1.0  # ... and as far outside from this many
MOST_REASONS = 3
COHORT_FORMAT = 1
_MEAN_DEVIATION_SCALE = 1.2533  # sqrt(π/2): the mean absolute deviation of a normal sample times this is its SD
_DISTANCE_TOLERANCE_MM2 = 1e-6  # squared distances are sums of squared multiples of the spacing: equal to a
# distance's square up to float rounding, far below this
_NO_DISTANCE = 1e-10  # added to mean reachability distances: patients with identical features have density 1e10
_ABSENT_CC = 1e-6  # a volume read back from a standardised vector below this was an absent structure's 0 cc
_FEATURE = re.compile(r"^(?P<structure>.+)\.(?:(?P<volume>volume_cc)|within_(?P<within>\d+)mm|(?P<axis>[a-z_]+)_mm)$")


def feature_names(site: Site) -> tuple[str, ...]:
    """The features of a patient of ``site``, in :func:`anatomy_features`' order."""
    return (*(f"{name}.volume_cc" for name in site.names),
            *(f"{organ}.within_{distance}mm" for organ in site.oars for distance in OVH_DISTANCES_MM),
            *(f"body.{axis}_mm" for axis in AXES))


def anatomy_features(structure_masks: np.ndarray, possible_dose_mask: np.ndarray, voxel_dimensions,
                     site: Site) -> dict[str, float]:
    """One patient's features (module docstring), ``{name: value}`` in :func:`feature_names` order.

    ``structure_masks``: the packed volume (bit k = ``site.names[k]``); ``possible_dose_mask``: the
    body, same shape; ``voxel_dimensions``: mm along the three axes of these volumes."""
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

def neighbours_for(patients: int) -> int:
    """The local outlier factor's k for a cohort of ``patients`` (module docstring)."""
    return max(1, min(NEIGHBOURS, (patients - 1) // 3))


def fit_cohort(features: pd.DataFrame) -> dict:
    """What scoring a patient against this cohort needs, JSON-able (NaN as None): ``features``
    (names, in order), ``patients``, ``centre`` and ``scale`` per feature (None: a constant
    feature, left out), ``vectors`` (each patient's standardised features, an absent structure's
    volume as 0 cc, None where a feature is missing), ``k``, ``order``, ``threshold`` (module
    docstring), ``method`` and ``format``.

    ``features``: one row per training patient (index: patient id), one column per feature
    (:func:`anatomy_features`' dicts stacked). At least 3 patients."""
    if not isinstance(features, pd.DataFrame):
        raise TypeError(f"Invalid `features`. Expected a pandas DataFrame (index patient, columns features). "
                        f"Received: {type(features).__name__}")
    if len(features) < 3:
        raise ValueError(f"Invalid `features`. Expected at least 3 patients to fit a cohort. Received: {len(features)}")
    names = [str(name) for name in features.columns]
    values = _for_distance(names, features.to_numpy(dtype=np.float64))
    with warnings.catch_warnings():  # a feature missing in every patient has no median: left out
        warnings.simplefilter("ignore", RuntimeWarning)
        centre = np.nanmedian(values, axis=0)
        deviation = np.abs(values - centre)
        scale = MAD_SCALE * np.nanmedian(deviation, axis=0)
        fallback = _MEAN_DEVIATION_SCALE * np.nanmean(deviation, axis=0)
    scale = np.where(scale > 0, scale, np.where(fallback > 0, fallback, np.nan))
    cohort = {"format": COHORT_FORMAT,
              "method": f"local outlier factor; robustly standardised features; distance of order {ORDER} over "
                        f"the features two patients have",
              "features": names, "patients": [str(patient) for patient in features.index],
              "centre": _json_list(centre), "scale": _json_list(scale),
              "vectors": [_json_list(row) for row in (values - centre) / scale],
              "k": neighbours_for(len(features)), "order": ORDER, "quantile": QUANTILE, "threshold": None}
    cohort["threshold"] = threshold_of(_left_out_factors(cohort))
    return cohort


def threshold_of(scores) -> float:
    """The flagging threshold from a cohort's leave-one-out scores (module docstring)."""
    scores = np.asarray(scores, dtype=np.float64)
    scores = scores[np.isfinite(scores)]
    return float(max(MIN_THRESHOLD, np.quantile(scores, QUANTILE))) if scores.size else MIN_THRESHOLD


def score(cohort: dict, features_row, first: str | None = None) -> tuple[float, list[str]]:
    """``(local outlier factor, reasons)`` of one patient's features (a dict or Series by feature
    name, as :func:`anatomy_features` gives them) against ``cohort`` (:func:`fit_cohort`'s). A
    feature of the cohort's that the row lacks counts as missing. ``first``: a feature whose reason
    comes first."""
    names = cohort["features"]
    raw = np.array([_number(features_row.get(name)) for name in names], dtype=np.float64)
    vectors = _array(cohort["vectors"])
    row = (_for_distance(names, raw[None, :])[0] - _array(cohort["centre"])) / _array(cohort["scale"])
    factor = _local_outlier_factor(_distances(vectors, vectors), _distances(row[None, :], vectors)[0], cohort["k"])
    return factor, _reasons(cohort, raw, np.arange(len(vectors)), first)


def scale_floor(name: str, centre: float) -> float:
    """The least scale a feature's distance beyond the cohort's range is measured in (module
    docstring): 0.05 for an overlap fraction, a tenth of the median volume (at least 1 cc), 10 mm."""
    parts = _FEATURE.match(name)
    if parts and parts["within"] is not None:
        return 0.05
    if parts and parts["volume"]:
        return max(0.1 * abs(centre), 1.0) if np.isfinite(centre) else 1.0
    return 10.0


def outside_range(cohort: dict, features_row, others: np.ndarray | None = None) -> tuple[float, str | None]:
    """How far the patient's feature furthest outside the training cohort's range lies beyond it,
    in robust scales of at least :func:`scale_floor` (0: all within), and that feature's name
    (None when all are within). Only the features the patient has, that some training patient has,
    and that vary across the cohort. ``others``: the rows of the training patients to compare with
    (leave-one-out); None: all."""
    names, centre, scale = cohort["features"], _array(cohort["centre"]), _array(cohort["scale"])
    cohort_raw = _raw(cohort) if others is None else _raw(cohort)[others]
    furthest, which = 0.0, None
    for column, name in enumerate(names):
        value, seen = _number(features_row.get(name)), cohort_raw[:, column]
        if np.isnan(value) or not np.isfinite(scale[column]) or np.all(np.isnan(seen)):
            continue
        spread = max(scale[column], scale_floor(name, centre[column]))
        beyond = max(value - float(np.nanmax(seen)), float(np.nanmin(seen)) - value, 0.0) / spread
        if beyond > furthest:
            furthest, which = float(beyond), name
    return furthest, which


def check(cohort: dict, features_row) -> dict:
    """A new patient's in-distribution check (module docstring): ``inside`` (False: outside the
    training cohort), ``score`` (its local outlier factor) and the cohort's ``threshold``,
    ``outside_scales`` and ``outside_feature`` (:func:`outside_range`; outside from
    :data:`FAR_SCALES`), and ``reasons`` (:func:`score`'s sentences; outside by a feature, that
    feature's first)."""
    scales, feature = outside_range(cohort, features_row)
    factor, reasons = score(cohort, features_row, first=feature if scales >= FAR_SCALES else None)
    threshold = float(cohort["threshold"])
    return {"inside": bool(factor <= threshold and scales < FAR_SCALES), "score": float(factor),
            "threshold": threshold, "outside_scales": scales, "outside_feature": feature, "reasons": list(reasons)}


def cohort_scores(cohort: dict) -> pd.DataFrame:
    """Each training patient scored leave-one-out, against the others only (module docstring):
    index ``patient``, columns ``score``, ``flagged`` (above the cohort's threshold, or one feature
    far outside the others' range; False before it has one), ``outside_scales`` and
    ``outside_feature`` (:func:`outside_range` against the others) and ``reasons`` (a list of
    sentences; a patient flagged by a feature far outside the range has that feature's first)."""
    raw = _raw(cohort)
    threshold = cohort["threshold"]
    rows = []
    for patient, factor in enumerate(_left_out_factors(cohort)):
        others = np.delete(np.arange(len(raw)), patient)
        scales, feature = outside_range(cohort, dict(zip(cohort["features"], raw[patient])), others)
        far = scales >= FAR_SCALES
        rows.append({"patient": cohort["patients"][patient], "score": factor,
                     "flagged": bool(threshold is not None and (factor > threshold or far)),
                     "outside_scales": scales, "outside_feature": feature,
                     "reasons": _reasons(cohort, raw[patient], others, first=feature if far else None)})
    return pd.DataFrame(rows).set_index("patient")


def _left_out_factors(cohort: dict) -> list[float]:
    """Each training patient's local outlier factor against the others only (leave-one-out)."""
    vectors = _array(cohort["vectors"])
    distances = _distances(vectors, vectors)
    factors = []
    for patient in range(len(vectors)):
        others = np.delete(np.arange(len(vectors)), patient)
        factors.append(_local_outlier_factor(distances[np.ix_(others, others)], distances[patient, others],
                                             cohort["k"]))
    return factors


def _local_outlier_factor(cohort_distances: np.ndarray, distances: np.ndarray, k: int) -> float:
    """The local outlier factor, with ``k`` neighbours, of a point ``distances`` away from each
    member of a cohort whose pairwise distances are ``cohort_distances`` (its diagonal ignored)."""
    within = cohort_distances.copy()
    np.fill_diagonal(within, np.inf)
    neighbours = np.argpartition(within, k - 1, axis=1)[:, :k]
    to_neighbours = np.take_along_axis(within, neighbours, axis=1)
    k_distance = to_neighbours.max(axis=1)
    density = 1.0 / (np.maximum(k_distance[neighbours], to_neighbours).mean(axis=1) + _NO_DISTANCE)
    own = np.argpartition(distances, k - 1)[:k]
    own_density = 1.0 / (np.maximum(k_distance[own], distances[own]).mean() + _NO_DISTANCE)
    return float(density[own].mean() / own_density)


def _distances(rows: np.ndarray, cohort: np.ndarray, order: int = ORDER) -> np.ndarray:
    """Distances of order ``order`` between standardised vectors over the features both have,
    scaled by (features / features in common)^(1/order); inf with none in common."""
    result = np.empty((len(rows), len(cohort)))
    for start in range(0, len(rows), 64):  # (64, cohort, features) at a time
        difference = np.abs(rows[start:start + 64, None, :] - cohort[None, :, :])
        common = np.count_nonzero(~np.isnan(difference), axis=2)
        summed = np.nansum(difference ** order, axis=2)
        with np.errstate(divide="ignore", invalid="ignore"):
            result[start:start + 64] = np.where(common > 0, (summed * rows.shape[1] / common) ** (1.0 / order), np.inf)
    return result


def _for_distance(names, values: np.ndarray) -> np.ndarray:
    """Feature values as distances take them: an absent structure's volume 0 cc."""
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
    the patient lacks and three quarters of them have, or has and none of them has; a value outside
    their range by more than :data:`OUTSIDE_SCALES` robust scales (by how far); a value within it
    :data:`NOTABLE_Z` robust scales or more from the median (by how far): scales of at least
    :func:`scale_floor`, as :func:`outside_range` measures (a reason never contradicts the rule).
    ``first``: a feature whose reason comes first (the one that flags the patient by the range rule)."""
    names, centre, scale = cohort["features"], _array(cohort["centre"]), _array(cohort["scale"])
    cohort_raw = _raw(cohort)[others]
    found = []  # (scales beyond the range, robust z, subject, sentence)
    for column, name in enumerate(names):
        value, seen = raw[column], cohort_raw[:, column]
        if name.endswith(".volume_cc"):
            having = np.count_nonzero(~np.isnan(seen))
            structure = name[:-len(".volume_cc")]
            if np.isnan(value):
                if having >= 0.75 * len(seen):
                    found.append((FAR_SCALES, 0.0, name, f"{structure} is absent (not contoured); {having} of the "
                                                   f"{len(seen)} training patients have it"))
                continue
            if not having:
                found.append((math.inf, 0.0, name, f"{structure} is present ({_cc(value)}); no training patient has it"))
                continue
        if np.isnan(value) or np.all(np.isnan(seen)):
            continue
        low, high = float(np.nanmin(seen)), float(np.nanmax(seen))
        if np.isfinite(scale[column]):  # in scales of at least scale_floor, as outside_range measures them
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
    found.sort(key=lambda item: (item[0], item[1]), reverse=True)
    if first is not None:
        found.sort(key=lambda item: item[2] != _subject(first))  # stable: the rest keep their order
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
