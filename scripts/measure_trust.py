#!/usr/bin/env python
"""Measure a commissioned cross-validated model's prediction bands and in-distribution check on
patients that took no part in them (issue: prediction bands and the in-distribution check).

    python scripts/measure_trust.py MODEL_DIR --data-dir DATA_DIR [--altered DIR ...] [--phantoms 20]
                                    [--cache-dir DIR]

MODEL_DIR is ``results/<model>`` after ``openkbp-commission`` (its ``commissioning/bands.json`` and
``cohort.json``) and ``--predict-only --stage validation --ensemble <model> --model-name <model>``
(its ``validation-predictions/``: the folds' ensemble, as deployed). Prints JSON:

- ``coverage``: at each nominal level, the share of the validation patients' (structure, metric)
  values that their band held, overall (with the coverage exchangeable residuals give at those
  ranks, ``expected``, and a patient-level bootstrap interval) and per structure-metric (the spread of those against what
  the binomial law allows at that many patients, and how many lie in the acceptance windows of
  85-95 % for 90 % bands and 63-73 % for 68 % bands), with the median band width in Gy;
- ``ensemble_against_folds``: per structure-metric the median |error| of the ensemble's validation
  predictions over the median |out-of-fold residual| of the single folds the bands are made of
  (below 1: the ensemble errs less, and its bands are conservative);
- ``in_distribution`` (the check alone, without a model: ``scripts/measure_flag.py``): the flag rate of
  the validation patients, of ``--phantoms`` synthetic
  head-and-neck phantoms (the demo's), and of each ``--altered`` data folder's split
  (``scripts/alter_anatomy.py``'s), grouped by alteration, with each flagged patient's reasons;
- with ``--members``, ``member_spread``: each fold predicts the validation patients alone; per
  structure-metric the Spearman correlation, across patients, of the folds' spread (their standard
  deviation) with the ensemble's |error|: whether a band scaled by the spread would track the
  error (the bands are not scaled: docs/trust.md says why), and the bands' coverage had each fold
  predicted alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provided_code.apps.score_folder import read_prediction  # noqa: E402
from provided_code.data.cache import load_split  # noqa: E402
from provided_code.data.csv_io import exact_dose, read_patient  # noqa: E402
from provided_code.data.phantoms import write_phantom_split  # noqa: E402
from provided_code.data_folder import split_dir  # noqa: E402
from provided_code.deployed_model import DeployedModel  # noqa: E402
from provided_code.metrics import calibration  # noqa: E402
from provided_code.metrics.dvh_table import patient_table  # noqa: E402
from provided_code.run_folder import RunFolder  # noqa: E402

WINDOWS = {0.9: (0.85, 0.95), 0.68: (0.63, 0.73)}  # the acceptance windows


def _rows(model: DeployedModel, data_dir: Path, cache_dir) -> tuple[pd.DataFrame, object]:
    """(patient, structure, metric, plan, predicted) of every validation patient with a dose."""
    predictions = RunFolder(model.source).predictions("validation")
    site = model.site
    arrays = load_split(split_dir(data_dir, "validation"), cache_dir=cache_dir, require_dose=False, site=site)
    records = []
    for row, pid in enumerate(arrays.patient_ids):
        if not arrays.has_dose[row]:
            continue
        plan = patient_table(exact_dose(arrays.dose[row].reshape(-1), int(arrays.dose_decimals[row])),
                             arrays.structure_masks[row], arrays.voxel_dimensions[row], site)
        predicted = patient_table(read_prediction(predictions, pid), arrays.structure_masks[row],
                                  arrays.voxel_dimensions[row], site)
        records += [(pid, structure, metric, plan[structure][metric], value)
                    for structure, values in predicted.items() for metric, value in values.items()]
    return pd.DataFrame(records, columns=["patient", "structure", "metric", "plan", "predicted"]), arrays


def _patient_bootstrap(rows: pd.DataFrame, draws: int = 2000, seed: int = 0) -> list[float]:
    """The 2.5 and 97.5 percentiles of the overall coverage over ``draws`` resamplings of the
    validation patients with replacement (a patient's values are not independent of each other)."""
    per_patient = rows.groupby("patient")["covered"].agg(["sum", "count"])
    covered, counts = per_patient["sum"].to_numpy(float), per_patient["count"].to_numpy(float)
    picks = np.random.default_rng(seed).integers(0, len(per_patient), size=(draws, len(per_patient)))
    shares = covered[picks].sum(axis=1) / counts[picks].sum(axis=1)
    return [round(float(q), 4) for q in np.quantile(shares, [0.025, 0.975])]


def _coverage(table: pd.DataFrame, bands: dict) -> dict:
    held = calibration.coverage_rows(table, bands["residuals"])
    overall = calibration.coverage_summary(held).set_index("nominal")
    pairs = calibration.coverage_summary(held, by=("structure", "metric"))
    structures = calibration.coverage_summary(held, by=("structure",))
    result = {}
    for level in calibration.LEVELS:
        at = pairs[np.isclose(pairs["nominal"], level)]
        within, spread = WINDOWS.get(level), []
        for row in at.itertuples():
            n_calibration = len(bands["residuals"][row.structure][row.metric])
            expected = calibration.exact_coverage(n_calibration, level)
            low, high = calibration.binomial_range(int(row.n), expected)
            spread.append({"structure": row.structure, "metric": row.metric, "n": int(row.n),
                           "observed": round(float(row.observed), 4), "expected": round(expected, 4),
                           "binomial_95": [round(low, 4), round(high, 4)],
                           "consistent": bool(low <= row.observed <= high),
                           "median_width_gy": round(float(row.median_width), 3)})
        expected_overall = sum(e["expected"] * e["n"] for e in spread) / sum(e["n"] for e in spread)
        entry = {"observed": round(float(overall.loc[level, "observed"]), 4), "values": int(overall.loc[level, "n"]),
                 "expected": round(expected_overall, 4),
                 "bootstrap_95": _patient_bootstrap(held[np.isclose(held["nominal"], level)]),
                 "median_width_gy": round(float(overall.loc[level, "median_width"]), 3),
                 "structure_metrics": len(spread),
                 "consistent_with_exchangeability": sum(e["consistent"] for e in spread),
                 "observed_range": [min(e["observed"] for e in spread), max(e["observed"] for e in spread)]}
        if within is not None:
            entry["in_acceptance_window"] = sum(within[0] <= e["observed"] <= within[1] + 1e-12 for e in spread)
            entry["acceptance_window"] = list(within)
        entry["per_structure"] = {row.structure: round(float(row.observed), 4) for row in
                                  structures[np.isclose(structures["nominal"], level)].itertuples()}
        entry["per_structure_metric"] = spread
        result[f"{level:g}"] = entry
    return result


def _ensemble_against_folds(table: pd.DataFrame, bands: dict) -> dict:
    ratios = []
    for (structure, metric), group in table.groupby(["structure", "metric"]):
        residuals = bands["residuals"].get(structure, {}).get(metric)
        if not residuals:
            continue
        folds = float(np.median(np.abs(residuals)))
        ensemble = float(np.median(np.abs(group["predicted"] - group["plan"])))
        if folds > 0:
            ratios.append((structure, metric, ensemble / folds))
    values = np.array([r for _, _, r in ratios])
    return {"structure_metrics": len(ratios), "median_ratio": round(float(np.median(values)), 3),
            "quartiles": [round(float(q), 3) for q in np.quantile(values, [0.25, 0.75])],
            "below_1": int((values < 1).sum())}


def _flags(trust, patients) -> dict:
    """The in-distribution check of each ``(patient id, structure masks, body, voxel size, site, CT)``."""
    flagged, scores = [], []
    for pid, masks, body, spacing, site, ct in patients:
        found = trust.in_distribution(masks, body, spacing, site, ct)
        scores.append(found["score"])
        if not found["inside"]:
            flagged.append({"patient": pid, "score": round(found["score"], 3), "p_value": round(found["p_value"], 4),
                            "feature": found["feature"], "reasons": found["reasons"]})
    return {"patients": len(scores), "flagged": len(flagged), "rate": round(len(flagged) / len(scores), 4),
            "median_score": round(float(np.median(scores)), 3), "flagged_patients": flagged}


def _folder_patients(split: Path, site, names=None):
    for folder in sorted(split.glob("pt_*")):
        if names is None or folder.name in names:
            patient = read_patient(folder, require_dose=False, site=site)
            yield (patient.patient_id, patient.structure_masks, patient.possible_dose_mask, patient.voxel_dimensions,
                   site, patient.ct)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ranks_a, ranks_b = pd.Series(a).rank().to_numpy(), pd.Series(b).rank().to_numpy()
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def _member_spread(model: DeployedModel, arrays, table: pd.DataFrame, bands: dict) -> dict:
    """Each fold's predictions of the validation patients with a dose, their spread per (patient,
    structure, metric) against the ensemble's |error| (module docstring), and the bands' overall
    coverage of the plans had each fold predicted alone (what the out-of-fold residuals the bands
    are made of describe: one fold, on patients it did not see)."""
    import keras

    from provided_code.inference import predict_full_resolution

    rows = [row for row in range(len(arrays)) if arrays.has_dose[row]]
    chosen = arrays.select(rows)
    values = {}  # (patient, structure, metric) -> [each fold's value]
    for member in model.members:  # each fold alone, at its deployed (final) checkpoint
        trained = member.load()
        doses = predict_full_resolution(trained.model, chosen, trained.spec, batch_size=1)
        for row, pid in enumerate(chosen.patient_ids):
            found = patient_table(doses[row], chosen.structure_masks[row], chosen.voxel_dimensions[row], chosen.site)
            for structure, metrics in found.items():
                for metric, value in metrics.items():
                    values.setdefault((pid, structure, metric), []).append(value)
        del trained, doses
        keras.backend.clear_session()
    table = table.assign(spread=[float(np.std(values[(r.patient, r.structure, r.metric)], ddof=1))
                                 for r in table.itertuples()], error=(table["predicted"] - table["plan"]).abs())
    correlations = []
    for (structure, metric), group in table.groupby(["structure", "metric"]):
        if len(group) >= 10 and group["spread"].std() > 0 and group["error"].std() > 0:
            correlations.append(_spearman(group["spread"].to_numpy(), group["error"].to_numpy()))
    correlations = np.array(correlations)
    alone = {}
    for k in range(len(model.members)):
        single = table.assign(predicted=[values[(r.patient, r.structure, r.metric)][k] for r in table.itertuples()])
        summary = calibration.coverage_summary(calibration.coverage_rows(single, bands["residuals"])).set_index("nominal")
        for level in WINDOWS:
            alone.setdefault(f"{level:g}", []).append(round(float(summary.loc[level, "observed"]), 4))
    return {"coverage_of_each_fold_alone": alone, "structure_metrics": len(correlations), "median_spearman": round(float(np.median(correlations)), 3),
            "quartiles": [round(float(q), 3) for q in np.quantile(correlations, [0.25, 0.75])],
            "positive": int((correlations > 0).sum()),
            "median_spread_gy": round(float(table["spread"].median()), 3),
            "median_error_gy": round(float(table["error"].median()), 3)}


def measure(model: Path, data_dir: Path, altered: list[Path], phantoms: int, cache_dir, members: bool) -> dict:
    deployed = DeployedModel.open(model)  # the folds, each at its final checkpoint, as predicted
    trust = deployed.trust(calibration.DEFAULT_COVERAGE)
    if trust.bands is None or trust.cohort is None:
        raise SystemExit(f"{model}: {trust.why_no_bands or trust.why_no_check}")
    table, arrays = _rows(deployed, data_dir, cache_dir)
    site = arrays.site
    result = {"model": str(model), "calibration_patients": trust.bands["patients"],
              "validation_patients": int(table["patient"].nunique()), "method": calibration.METHOD,
              "coverage": _coverage(table, trust.bands), "ensemble_against_folds": _ensemble_against_folds(
                  table, trust.bands)}
    flags = {"alpha": trust.cohort["alpha"], "threshold": trust.cohort["threshold"],
             "validation": _flags(trust, [(pid, arrays.structure_masks[row], arrays.possible_dose_mask[row],
                                           arrays.voxel_dimensions[row], site, arrays.ct[row])
                                          for row, pid in enumerate(arrays.patient_ids)])}
    with tempfile.TemporaryDirectory() as folder:
        write_phantom_split(Path(folder), phantoms, first_number=201, with_dose=False)
        flags["phantoms"] = _flags(trust, list(_folder_patients(Path(folder), site)))
    for data in altered:
        record = json.loads((data / "altered.json").read_text())
        kinds = {}
        for name, entry in record["altered"].items():
            kinds.setdefault(entry["alteration"], []).append(name)
        for kind, names in kinds.items():
            flags[f"{kind} ({data.name})"] = _flags(trust, list(_folder_patients(split_dir(data, record["split"]),
                                                                                  site, set(names))))
    result["in_distribution"] = flags
    if members:
        result["member_spread"] = _member_spread(deployed, arrays, table, trust.bands)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--altered", type=Path, action="append", default=[])
    parser.add_argument("--phantoms", type=int, default=20)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--members", action="store_true", help="also predict with each fold alone (member_spread)")
    args = parser.parse_args()
    print(json.dumps(measure(args.model, args.data_dir, args.altered, args.phantoms, args.cache_dir, args.members),
                     indent=1))


if __name__ == "__main__":
    main()
