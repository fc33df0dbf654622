"""openkbp-commission on a cross-validated model: its figures from the folds' out-of-fold predictions
alone (nothing predicted again), a plain recomputation of them, the unfinished folds named, the
model card's checksums, and the verdict by the physicist's tolerances on the report and the card."""

import hashlib
import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from provided_code.apps.commission import run as commission_module
from provided_code.apps.commission.run import CommissioningError, certify, commission, complete_folds
from provided_code.data.cache import load_split
from provided_code.data.csv_io import exact_dose, read_sparse_csv
from provided_code.deployed_model import DeployedModel
from provided_code.folds import read_dealing
from provided_code.metrics.scoring import dvh_metrics, metric_columns, structure_indices
from provided_code.run_folder import RunFolder
from provided_code.sites import openkbp
from tests.kit.made_once import made_once_with_value


@pytest.fixture(scope="module")
def commissioning(cv_model, phantom_data, phantom_cache, tmp_path_factory):
    """A copy of the cross-validated model (no validation predictions: conftest's ``commissioned_cv``
    has them), commissioned once per test run (read-only; the workers share it): the model's folder,
    the report, and the calls commissioning made meanwhile to the functions that predict a patient
    (each then run)."""
    import provided_code.inference as inference

    def make(root):
        model = root / "cv"
        shutil.copytree(cv_model, model)
        predicted = []

        def recorded(name, original):
            def call(*args, **kwargs):
                predicted.append(name)
                return original(*args, **kwargs)
            return call

        with pytest.MonkeyPatch.context() as patch:
            for name in ("predict_full_resolution", "predict_arrays"):
                patch.setattr(inference, name, recorded(name, getattr(inference, name)))
            report = commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
        return model, report, predicted

    return made_once_with_value(tmp_path_factory, "commissioning", make)


@pytest.fixture(scope="module")
def commissioned(commissioning):
    """``commissioning``'s model folder and report."""
    model, report, _ = commissioning
    return model, report


@pytest.mark.slow
def test_the_figures_are_those_of_the_out_of_fold_predictions_recomputed_plainly(commissioned, phantom_data,
                                                                                phantom_cache):
    model, report = commissioned
    folder = model / "commissioning"
    assert sorted(p.name for p in folder.iterdir()) == sorted(commission_module.FILES.values())
    dealing = read_dealing(model)
    arrays = load_split(phantom_data / "train-pats", cache_dir=phantom_cache, site=openkbp())
    plans = pd.read_csv(folder / "plans.csv")
    site = arrays.site
    differences = []
    for row, pid in enumerate(arrays.patient_ids):
        # the fold that held the patient out wrote its prediction; the plan is its dose.csv
        path = model / f"fold-{dealing.fold_of(pid)}" / "held-out-predictions" / f"{pid}.csv"
        indices, values = read_sparse_csv(path, pid, with_values=True)
        predicted = np.zeros(arrays.dose[row].size)
        predicted[indices] = values
        plan = exact_dose(arrays.dose[row].reshape(-1), int(arrays.dose_decimals[row]))
        voxels = structure_indices(arrays.structure_masks[row], len(site.names))
        columns = metric_columns(site)
        expected_plan = dvh_metrics(lambda v: plan[v], voxels, arrays.voxel_dimensions[row], site, columns)
        expected_predicted = dvh_metrics(lambda v: predicted[v], voxels, arrays.voxel_dimensions[row], site, columns)
        mine = plans[plans.patient == pid].set_index(["structure", "metric"])
        for k, structure in enumerate(site.names):
            for m, metric in enumerate(site.metric_names):
                if np.isnan(expected_plan[k, m]):
                    assert (structure, metric) not in mine.index
                    continue
                # plans.csv keeps 4 decimals (float_format): half a unit of the last, plus float64 ulps
                assert mine.loc[(structure, metric), "plan"] == pytest.approx(expected_plan[k, m], abs=5e-5)
                assert mine.loc[(structure, metric), "predicted"] == pytest.approx(expected_predicted[k, m], abs=5e-5)
                differences.append((structure, metric, expected_predicted[k, m] - expected_plan[k, m]))
    by_metric = pd.DataFrame(differences, columns=["structure", "metric", "difference"])
    summary = pd.read_csv(folder / "summary.csv").set_index(["structure", "metric"])
    for (structure, metric), group in by_metric.groupby(["structure", "metric"]):
        assert summary.loc[(structure, metric), "bias"] == pytest.approx(group.difference.mean(), abs=1e-4)
        assert summary.loc[(structure, metric), "mae"] == pytest.approx(group.difference.abs().mean(), abs=1e-4)
    figures = json.loads((folder / "report.json").read_text())
    held_out = {fold["fold"]: fold["scores"] for fold in figures["folds"]}
    # the out-of-fold dose score is the patients' mean, so the folds' means weighted by their patients
    weighted = sum(s["dose_score"] * s["patients"] for s in held_out.values()) / sum(s["patients"] for s in
                                                                                     held_out.values())
    assert figures["scores"]["dose_score"] == pytest.approx(weighted, rel=1e-9)
    assert figures["cohort"]["patients"] == arrays.patient_ids and figures["cohort"]["folds"] == 2
    assert report.report["scores"] == figures["scores"]


@pytest.mark.slow
def test_the_page_reads_without_a_network_and_the_card_checksums_its_checkpoints(commissioned):
    model, _ = commissioned
    page = (model / "commissioning" / "report.html").read_text()
    assert "http" not in page and "src=\"//" not in page and "@import" not in page
    card = json.loads((model / "commissioning" / "model_card.json").read_text())
    assert [c["fold"] for c in card["checkpoints"]] == [1, 2]
    for checkpoint in card["checkpoints"]:
        assert checkpoint["sha256"] == hashlib.sha256((model / checkpoint["path"]).read_bytes()).hexdigest()
    text = (model / "commissioning" / "MODEL_CARD.md").read_text()
    assert f"`{card['checkpoints'][0]['sha256']}`" in text and "Excluded from training: none." in text


@pytest.mark.slow
def test_nothing_is_predicted_again(commissioning):
    """The module's commissioning itself (not one more): it read the folds' out-of-fold predictions."""
    _, _, predicted = commissioning
    assert predicted == [], "commissioning predicted a patient"


@pytest.mark.slow
def test_a_missing_or_unfinished_fold_is_named(commissioned, tmp_path, phantom_data, phantom_cache):
    model, _ = commissioned
    broken = tmp_path / "cv"
    shutil.copytree(model, broken)
    shutil.rmtree(broken / "fold-2" / "held-out-predictions")
    with pytest.raises(CommissioningError, match=r"Cannot commission cv yet: fold 2 has no out-of-fold predictions "
                                                 r"of its epoch 1"):
        commission(broken, data_dir=phantom_data, cache_dir=phantom_cache)
    shutil.rmtree(broken / "fold-2")
    with pytest.raises(CommissioningError, match=r"fold 2 is not trained"):
        commission(broken, data_dir=phantom_data, cache_dir=phantom_cache)
    with pytest.raises(CommissioningError, match="is not a cross-validated model"):
        commission(tmp_path, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_a_training_split_that_is_not_the_one_dealt_is_refused(commissioned, tmp_path, phantom_data):
    """The folds' figures are of the patients they were dealt: a data folder whose training split
    lost one (or gained one) is refused naming the patient, before anything is written."""
    from provided_code.folds import FoldsError

    model, _ = commissioned
    data = tmp_path / "data"
    shutil.copytree(phantom_data, data)
    gone = sorted(read_dealing(model).patients)[0]
    shutil.rmtree(data / "train-pats" / gone)
    before = sorted(p.name for p in (model / "commissioning").rglob("*"))
    with pytest.raises(FoldsError, match=f"{gone} was dealt but is not in {data / 'train-pats'} any more"):
        commission(model, data_dir=data, cache_dir=tmp_path / "cache")
    assert sorted(p.name for p in (model / "commissioning").rglob("*")) == before


@pytest.mark.slow
def test_an_excluded_patient_whose_files_cannot_be_read_does_not_stop_the_commissioning(cv_model, tmp_path,
                                                                                     phantom_data):
    """A patient the folds excluded for its files (another patient's plan in its folder, its dose
    outside its possible-dose mask) is left out of the reading, still one of the patients dealt."""
    model, data = tmp_path / "cv", tmp_path / "data"
    shutil.copytree(cv_model, model)
    shutil.copytree(phantom_data, data)
    first, patient = sorted(read_dealing(model).patients)[:2]
    shutil.copy(data / "train-pats" / first / "dose.csv", data / "train-pats" / patient / "dose.csv")
    configs = sorted(model.glob("fold-*/models/config.json"))
    assert len(configs) == 2
    for config in configs:  # as folds trained with --exclude would have recorded it
        saved = json.loads(config.read_text())
        saved["excluded"] = [{"patient": patient, "reason": "another patient's plan"}]
        config.write_text(json.dumps(saved))
    report = commission(model, data_dir=data, cache_dir=tmp_path / "cache")
    others = sorted(set(read_dealing(model).patients) - {patient})
    written = json.loads((model / "commissioning" / "report.json").read_text())
    assert written["cohort"]["excluded"] == [{"patient": patient, "reason": "another patient's plan"}]
    assert sorted(written["cohort"]["patients"]) == others and report.report["cohort"] == written["cohort"]
    assert sorted(pd.read_csv(model / "commissioning" / "plans.csv").patient.unique()) == others  # scored
    card = (model / "commissioning" / "MODEL_CARD.md").read_text()
    assert f"- Excluded from training (and why):\n  - {patient}: another patient's plan\n" in card


@pytest.mark.slow
def test_a_fold_still_training_or_another_commissioning_is_named_and_nothing_is_written(commissioned, tmp_path,
                                                                                     phantom_data, phantom_cache):
    from provided_code.errors import RunLockedError
    from provided_code.run_folder import RunFolder

    model, _ = commissioned
    copy = tmp_path / "cv"
    shutil.copytree(model, copy)
    before = sorted(p.name for p in (copy / "commissioning").rglob("*"))
    with RunFolder(copy / "fold-2").lock("training"):
        with pytest.raises(RunLockedError, match=r"fold-2 is in use by another run \(pid \d+ on .*, training since"):
            commission(copy, data_dir=phantom_data, cache_dir=phantom_cache)
    with RunFolder(copy).lock("commissioning"):
        with pytest.raises(RunLockedError, match=r"cv is in use by another run \(pid \d+ on .*, commissioning since"):
            commission(copy, data_dir=phantom_data, cache_dir=phantom_cache)
    assert sorted(p.name for p in (copy / "commissioning").rglob("*")) == before


@pytest.mark.slow
def test_bands_hold_each_structure_metrics_out_of_fold_residuals_sorted_and_the_folds_that_made_them(commissioned_cv):
    folder = commissioned_cv / "commissioning"
    bands = json.loads((folder / "bands.json").read_text())
    plans = pd.read_csv(folder / "plans.csv")
    assert bands["patients"] == plans.patient.nunique() == 4
    for (structure, metric), group in plans.groupby(["structure", "metric"]):
        # plans.csv keeps 4 decimals: half a unit of the last
        assert bands["residuals"][structure][metric] == pytest.approx(sorted(group.difference), abs=5e-5)
    assert sum(len(metrics) for metrics in bands["residuals"].values()) == len(plans.groupby(["structure", "metric"]))
    for entry in bands["folds"]:  # each fold's final checkpoint, by its SHA-256
        epoch, checkpoint = RunFolder(commissioned_cv / f"fold-{entry['fold']}").checkpoints()[0]
        assert (entry["epoch"], entry["sha256"]) == (epoch, hashlib.sha256(checkpoint.read_bytes()).hexdigest())


@pytest.mark.slow
def test_the_calibration_is_the_bands_coverage_of_the_validation_predictions_recomputed_plainly(
        commissioned_cv, phantom_data, phantom_cache):
    from provided_code.metrics import anatomy
    from provided_code.metrics.calibration import band

    folder = commissioned_cv / "commissioning"
    bands = json.loads((folder / "bands.json").read_text())
    cohort = json.loads((folder / "cohort.json").read_text())
    calibration = json.loads((folder / "report.json").read_text())["calibration"]
    arrays = load_split(phantom_data / "validation-pats", cache_dir=phantom_cache, site=openkbp())
    site = arrays.site
    held = {}  # (structure, metric, level) -> [covered, ...]
    for row, pid in enumerate(arrays.patient_ids):
        indices, values = read_sparse_csv(commissioned_cv / "validation-predictions" / f"{pid}.csv", pid,
                                          with_values=True)
        predicted = np.zeros(arrays.dose[row].size)
        predicted[indices] = values
        plan = exact_dose(arrays.dose[row].reshape(-1), int(arrays.dose_decimals[row]))
        voxels = structure_indices(arrays.structure_masks[row], len(site.names))
        tables = [dvh_metrics(lambda v: dose[v], voxels, arrays.voxel_dimensions[row], site, metric_columns(site))
                  for dose in (plan, predicted)]
        for k, structure in enumerate(site.names):
            for m, metric in enumerate(site.metric_names):
                if np.isnan(tables[0][k, m]):
                    continue
                for level in calibration["levels"]:
                    bounds = band(tables[1][k, m], bands["residuals"][structure][metric], level)
                    if bounds is not None:
                        held.setdefault((structure, metric, level), []).append(
                            bounds[0] <= tables[0][k, m] <= bounds[1])
        features = anatomy.anatomy_features(arrays.structure_masks[row], arrays.possible_dose_mask[row],
                                            arrays.voxel_dimensions[row], site, arrays.ct[row])
        entry = next(e for e in calibration["in_distribution"] if e["patient"] == pid)
        checked = anatomy.check(cohort, features)
        assert entry["score"] == pytest.approx(checked["score"], rel=1e-12) and entry["p_value"] == checked["p_value"]
        # 4 training patients cannot flag at 0.05: every patient is inside, and says why
        assert entry["inside"] and entry["too_small"] == anatomy.too_small(4, 0.05) != ""
    assert held, "4 training patients give 50 % bands"
    found = {(r["structure"], r["metric"], r["nominal"]): r for r in calibration["by_structure_metric"]}
    for key, covered in held.items():  # the site's metrics: the clinical ones are recomputed by the same rows
        assert found[key]["n"] == len(covered) and found[key]["observed"] == pytest.approx(np.mean(covered))
    assert calibration["patients"] == arrays.patient_ids
    from provided_code.metrics.calibration import binomial_range

    for row in calibration["by_structure_metric"]:  # each cell against its binomial 95 % range at the band's coverage
        low, high = binomial_range(row["n"], row["exact"])
        assert (row["range_low"], row["range_high"]) == (low, high)
        assert row["outside"] == (not low <= round(row["observed"] * row["n"]) / row["n"] <= high)
    check = calibration["range_check"]
    assert check["cells"] == len(calibration["by_structure_metric"]) and check["expected"] == pytest.approx(
        0.05 * check["cells"]) and check["outside"] == sum(row["outside"] for row in calibration["by_structure_metric"])
    card = (folder / "MODEL_CARD.md").read_text()  # the check's level, and that 4 patients cannot flag at it
    assert ("- In-distribution check: flags a patient whose anatomy and CT have a conformal p-value below alpha = "
            f"0.05 against the training patients' (a patient like them is flagged at most 5 % of the time); "
            f"{anatomy.too_small(4, 0.05)}.") in card
    page = (folder / "report.html").read_text()
    assert 'id="calibration"' in page and "Reliability: observed against nominal coverage" in page
    assert f"Prediction bands: <b>{check['outside']} of {check['cells']}</b> structure-metric cells" in \
        page[:page.index("<nav>")]
    assert (f"Prediction bands on the validation patients: {check['outside']} of {check['cells']} structure-metric "
            f"cells outside their binomial 95 % range") in card


@pytest.mark.slow
def test_validation_predictions_written_before_deployed_models_are_read_by_the_calibration_and_the_card(
        commissioned_cv, tmp_path, phantom_data, phantom_cache):
    """A scores.json as earlier versions wrote it ("epoch": "ensemble" beside members without their
    SHA-256): commissioning's calibration takes the predictions (matched by epoch) and the card
    names the members, as of one written today."""
    model = tmp_path / "cv"
    shutil.copytree(commissioned_cv, model)
    path = model / "validation-predictions" / "scores.json"
    written = json.loads(path.read_text())
    legacy = [{"model": member["model"], "epoch": member["epoch"]} for member in written["members"]]
    path.write_text(json.dumps({**written, "epoch": "ensemble", "members": legacy}))
    report = commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    assert "note" not in report.report["calibration"] and report.report["calibration"]["patients"]
    card = json.loads((model / "commissioning" / "model_card.json").read_text())
    assert card["scores"]["deployed"]["members"] == legacy == [{"model": f"cv-fold-{k}", "epoch": 1} for k in (1, 2)]


@pytest.mark.slow
def test_without_validation_predictions_the_report_says_how_to_make_them(commissioned):
    _, report = commissioned
    assert report.report["calibration"]["note"].startswith("No scored validation predictions of the folds' ensemble")
    assert "--predict-only --stage validation --ensemble cv --model-name cv" in report.report["calibration"]["note"]
@pytest.mark.slow
def test_the_card_names_the_parent_and_a_parent_checkpoint_changed_since(commissioned, tmp_path, phantom_data,
                                                                         phantom_cache, caplog):
    """Folds started from a parent (--init-from; config.json's record, as training writes it): the
    card says from which checkpoint, what was taken, and that the file is no longer the one recorded."""
    model, _ = commissioned
    tuned = tmp_path / "cv"
    shutil.copytree(model, tuned)
    checkpoint = tmp_path / "parent" / "models" / "best.keras"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"the parent's weights")
    record = {"model": "parent", "folder": str(tmp_path / "parent"), "site": "openkbp", "epoch": 40,
              "checkpoint": "models/best.keras", "sha256": hashlib.sha256(b"the parent's weights").hexdigest(),
              "taken": ["encoder_2_conv", "dose_conv"],
              "not_taken": [{"layer": "encoder_1_conv", "why": "kernel 4×4×4×12×4 in the parent, 4×4×4×5×4 here"}],
              "taken_fingerprint": "0123456789abcdef"}
    for fold in ("fold-1", "fold-2"):
        path = tuned / fold / "models" / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "parent": record, "init_from": record["folder"]}))
    commission(tuned, data_dir=phantom_data, cache_dir=phantom_cache)
    card = json.loads((tuned / "commissioning" / "model_card.json").read_text())
    assert card["parent"] == {**record, "changed": None, "checkable": True}
    text = (tuned / "commissioning" / "MODEL_CARD.md").read_text()
    assert (f"Every fold started from model parent (site openkbp, {tmp_path / 'parent'}): its epoch 40 checkpoint "
            f"models/best.keras, SHA-256 `{record['sha256']}`.") in text
    assert "- Taken: 2 layers (encoder_2_conv, dose_conv)." in text
    assert "- Not taken (initialised as usual): encoder_1_conv (kernel 4×4×4×12×4 in the parent" in text
    assert "- The parent's checkpoint is unchanged since (SHA-256)." in text

    checkpoint.write_bytes(b"the parent, trained on")  # a newer best.keras
    with caplog.at_level(logging.WARNING):
        commission(tuned, data_dir=phantom_data, cache_dir=phantom_cache)
    card = json.loads((tuned / "commissioning" / "model_card.json").read_text())
    now = hashlib.sha256(b"the parent, trained on").hexdigest()
    assert card["parent"]["changed"] == (f"{checkpoint} changed since it was recorded (SHA-256 {record['sha256'][:12]}…, "
                                         f"now {now[:12]}…)")
    assert (f"- **The parent's checkpoint is not the one the folds started from**: {card['parent']['changed']}."
            in (tuned / "commissioning" / "MODEL_CARD.md").read_text())
    assert f"The parent of these folds, 'parent': its checkpoint {checkpoint} changed since" in caplog.text
    checkpoint.unlink()  # commissioned where the parent is not: nothing to say it changed
    commission(tuned, data_dir=phantom_data, cache_dir=phantom_cache)
    text = (tuned / "commissioning" / "MODEL_CARD.md").read_text()
    assert f"- The parent's checkpoint cannot be checked here: {checkpoint} is gone" in text
    assert "is not the one the folds started from" not in text
    assert "Random weights (no --init-from)." in (model / "commissioning" / "MODEL_CARD.md").read_text()


# -- what commissioning certifies: the checkpoints, the predictions and the plans it measured --------------------

def _copy(commissioned, tmp_path):
    model, _ = commissioned
    copy = tmp_path / "cv"
    shutil.copytree(model, copy)
    return copy


@pytest.mark.slow
def test_a_fold_holding_another_folds_checkpoint_is_refused_naming_it(commissioned, tmp_path, phantom_data,
                                                                     phantom_cache):
    model = _copy(commissioned, tmp_path)
    first, second = (RunFolder(model / f"fold-{k}").checkpoints()[0][1] for k in (1, 2))
    shutil.copy(first, second)  # fold 2's checkpoint replaced by fold 1's
    with pytest.raises(CommissioningError, match=r"^Cannot commission: fold 2's checkpoint .*epoch_1.keras is "
                                                 r"byte-identical to fold 1's \(SHA-256 [0-9a-f]{12}…\)"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_a_deployed_model_whose_members_are_not_the_folds_in_order_certifies_nothing(cv_model):
    """certify pairs each fold with the deployed model's member of the same fold: members in another
    order (or another count) are refused, not certified against another fold's record."""
    _, folds = complete_folds(cv_model)
    model = DeployedModel.open(cv_model)
    with pytest.raises(ValueError, match=r"^Invalid `model`. Expected the members of folds 2, 1, in order. Received: "
                                         r"model='cv' of cv-fold-1 \(fold 1\), cv-fold-2 \(fold 2\)$"):
        certify(model, folds[::-1])


@pytest.mark.slow
def test_a_checkpoint_with_bytes_flipped_is_refused_naming_the_fold(commissioned, tmp_path, phantom_data,
                                                                   phantom_cache):
    model = _copy(commissioned, tmp_path)
    checkpoint = RunFolder(model / "fold-1").checkpoints()[0][1]
    data = bytearray(checkpoint.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(255 - b for b in data[middle:middle + 8])
    checkpoint.write_bytes(bytes(data))
    with pytest.raises(CommissioningError, match=r"^Cannot commission: fold 1's checkpoint .* is not the one that made "
                                                 r"its out-of-fold predictions"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_a_checkpoint_that_does_not_load_is_refused_naming_the_fold(commissioned, tmp_path, phantom_data,
                                                                   phantom_cache):
    """Damaged before its predictions' record was written (the record matches): it does not load,
    said as the deployed model is opened (not a complete .keras file), naming the fold's file."""
    model = _copy(commissioned, tmp_path)
    checkpoint = RunFolder(model / "fold-2").checkpoints()[0][1]
    checkpoint.write_bytes(checkpoint.read_bytes()[:1000])
    scores = model / "fold-2" / "held-out-predictions" / "scores.json"
    saved = json.loads(scores.read_text())
    saved["made_with"]["checkpoint"]["sha256"] = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    scores.write_text(json.dumps(saved))
    with pytest.raises(CommissioningError, match=rf"^Cannot commission: Checkpoint {re.escape(str(checkpoint))} does not "
                                                 rf"load: not a complete \.keras file .*: restore it, or train its "
                                                 rf"fold again\.$"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_an_edited_out_of_fold_prediction_is_refused_naming_the_fold_and_file(commissioned, tmp_path, phantom_data,
                                                                              phantom_cache):
    model = _copy(commissioned, tmp_path)
    path = sorted((model / "fold-2" / "held-out-predictions").glob("pt_*.csv"))[0]
    lines = path.read_text().splitlines()
    index, value = lines[1].split(",")[:2]
    lines[1] = f"{index},{float(value or 0) + 1}"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CommissioningError, match=rf"^Cannot commission: fold 2's out-of-fold prediction .*{path.name} "
                                                 rf"changed since the fold wrote it"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_plans_changed_since_the_folds_predicted_them_are_refused_naming_the_patients(commissioned, tmp_path,
                                                                                   phantom_data):
    from provided_code.data.csv_io import write_sparse_csv

    model, data = _copy(commissioned, tmp_path), tmp_path / "data"
    shutil.copytree(phantom_data, data)
    patient = sorted(read_dealing(model).patients)[1]
    dose = data / "train-pats" / patient / "dose.csv"
    indices, values = read_sparse_csv(dose, patient, with_values=True)
    write_sparse_csv(dose, indices, (values * 0.8).astype(np.float32))  # the plan scaled since
    with pytest.raises(CommissioningError, match=rf"^Cannot commission cv: the files of {patient} \(dose\.csv\) in "
                                                 rf"{data / 'train-pats'} changed since the folds predicted them"):
        commission(model, data_dir=data, cache_dir=tmp_path / "cache")


@pytest.mark.slow
def test_folds_that_excluded_different_patients_are_refused_naming_them(commissioned, tmp_path, phantom_data,
                                                                       phantom_cache):
    model = _copy(commissioned, tmp_path)
    patient = sorted(read_dealing(model).patients)[0]
    config = model / "fold-2" / "models" / "config.json"  # fold 2 retrained with --exclude (--change-recipe)
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "excluded": [{"patient": patient, "reason": "replanned"}]}))
    with pytest.raises(CommissioningError, match=rf"^The folds of cv left out different patients with --exclude "
                                                 rf"\(fold 1: none; fold 2: {patient}\)"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_predictions_that_do_not_record_their_checkpoint_are_named_with_the_command(commissioned, tmp_path,
                                                                                   phantom_data, phantom_cache):
    model = _copy(commissioned, tmp_path)
    scores = model / "fold-1" / "held-out-predictions" / "scores.json"
    scores.write_text(json.dumps({k: v for k, v in json.loads(scores.read_text()).items() if k != "made_with"}))
    with pytest.raises(CommissioningError, match=r"fold 1's out-of-fold predictions do not record the checkpoint "
                                                 r"that made them .* Run the same command with --fold K"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


# -- its messages ----------------------------------------------------------------------------------------------

def test_a_missing_model_folder_is_said_so_not_as_a_missing_splits_json(tmp_path):
    with pytest.raises(CommissioningError, match=rf"^Invalid `model_dir`. Expected a cross-validated model's folder "
                                                 rf"\(results/<model>\). Received: {tmp_path / 'hn'}, which does not "
                                                 rf"exist$"):
        commission(tmp_path / "hn")


@pytest.mark.slow
def test_another_commissioning_running_is_waited_for_not_a_new_model_name(commissioned, tmp_path, phantom_data,
                                                                         phantom_cache):
    from provided_code.errors import RunLockedError

    model = _copy(commissioned, tmp_path)
    with RunFolder(model).lock("commissioning"):
        with pytest.raises(RunLockedError) as refused:
            commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    assert str(refused.value).endswith("; wait for it to end, then commission again")
    assert "--model-name" not in str(refused.value)


@pytest.mark.slow
def test_a_full_disk_names_the_file_being_written_and_leaves_the_previous_commissioning(commissioned, tmp_path,
                                                                                       phantom_data, phantom_cache,
                                                                                       monkeypatch):
    import errno

    model = _copy(commissioned, tmp_path)
    before = (model / "commissioning" / "report.json").read_bytes()

    def full(self, *args, **kwargs):  # as a write deep inside pandas fails: an OSError naming no file
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_csv", full)
    with pytest.raises(OSError) as failed:
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(model / "commissioning" / "plans.csv")
    assert (model / "commissioning" / "report.json").read_bytes() == before
    assert sorted(p.name for p in model.iterdir() if p.name.startswith(".commissioning")) == []


@pytest.mark.slow
def test_a_fold_whose_held_out_patients_are_all_excluded_is_said_so_not_run_it(commissioned, tmp_path, phantom_data,
                                                                              phantom_cache):
    """Fold 2 could not be trained (its held-out patients all excluded by fold 1's list): running it
    again would be refused again; the patients must be dealt again."""
    model = _copy(commissioned, tmp_path)
    held = read_dealing(model).held_out_of(2)
    config = model / "fold-1" / "models" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()),
                                  "excluded": [{"patient": pid, "reason": "replanned"} for pid in held]}))
    shutil.rmtree(model / "fold-2")
    with pytest.raises(CommissioningError, match=rf"^Cannot commission cv: fold 2's held-out patients "
                                                 rf"\({', '.join(held)}\) are all excluded") as refused:
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    assert "not trained" not in str(refused.value)


@pytest.mark.slow
def test_the_verdict_by_the_default_tolerances_heads_the_report_and_the_card(commissioned):
    """Judged on plans.csv as a plain recomputation: each organ's Dmean and each target's D95 within
    3 Gy for 90 %; 4 patients are too few to judge any, which the report and the card say, and
    neither passes the model."""
    from provided_code.metrics.commissioning import patients_to_judge

    model, report = commissioned
    folder = model / "commissioning"
    plans = pd.read_csv(folder / "plans.csv")
    found = json.loads((folder / "report.json").read_text())["verdict"]
    site = openkbp()
    expected = [(name, "Dmean") for name in site.oars] + [(name, "D95") for name in site.targets]
    assert [(c["structure"], c["metric"]) for c in found["cells"]] == expected
    for cell in found["cells"]:
        rows = plans[(plans.structure == cell["structure"]) & (plans.metric == cell["metric"])]
        assert cell["n"] == len(rows) <= 4 and cell["needed"] == patients_to_judge(0.9) == 10
        assert cell["within"] == int(((rows.predicted - rows.plan).abs() <= 3.0 + 1e-4).sum())  # plans.csv: 4 decimals
        assert cell["status"] == "too few"
    assert found["status"] == "not judged" and found["failing"] == [] and len(found["unjudged"]) == len(expected)
    assert found["tolerances"]["source"] == "the defaults" and found["tolerances"]["sha256"] is None
    page = (folder / "report.html").read_text()
    first = page[:page.index("<nav>")]
    assert "Verdict: Not judged: too few patients" in first and "Within the tolerances" not in page
    card = (folder / "MODEL_CARD.md").read_text()
    assert card.index("## Verdict") < card.index("## Site")
    assert f"**Not judged: too few patients.** {found['words']}" in card
    assert "| PTV70 | D95 | 3 Gy | " in card and card.count("| too few patients |") == len(expected)
    assert json.loads((folder / "model_card.json").read_text())["verdict"]["status"] == "not judged"
    assert f"Verdict (the defaults): {found['words']}" in report.summary()


@pytest.mark.slow
def test_a_tolerance_file_is_recorded_and_a_bad_one_refused_before_anything_is_read(commissioned, tmp_path,
                                                                                   phantom_data, phantom_cache):
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    model = _copy(commissioned, tmp_path)
    before = (model / "commissioning" / "report.json").read_bytes()
    bad = tmp_path / "bad.csv"
    bad.write_text("structure,metric,within_gy,fraction\ntargets,D95,3,0.9\nParotid_L,Dmean,3,0.9\n")
    result = CliRunner().invoke(cli.commission_command, [str(model), "--data-dir", str(phantom_data), "--cache-dir",
                                                         str(phantom_cache), "--tolerances", str(bad)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert (f"Error: Invalid `tolerances`. Expected a structure of site openkbp (Brainstem, SpinalCord, "
            f"RightParotid, LeftParotid, Esophagus, Larynx, Mandible, PTV56, PTV63, PTV70), organs or targets. "
            f"Received: {bad}, line 3: unknown structure 'Parotid_L'") in result.output
    negative = tmp_path / "negative.csv"
    negative.write_text("structure,metric,within_gy,fraction\nPTV70,D95,-3,0.9\n")
    result = CliRunner().invoke(cli.commission_command, [str(tmp_path / "no-model"), "--tolerances", str(negative)])
    assert result.exit_code == 1 and f"Received: {negative}, line 2: 'PTV70,D95,-3,0.9'" in result.output
    assert (model / "commissioning" / "report.json").read_bytes() == before  # nothing written
    good = tmp_path / "clinic.csv"
    good.write_text("structure,metric,within_gy,fraction\norgans,Dmean,4,0.9\nPTV70,D95,2,0.95\n")
    commission(model, data_dir=phantom_data, cache_dir=phantom_cache, tolerances=good)
    found = json.loads((model / "commissioning" / "report.json").read_text())["verdict"]
    assert found["tolerances"] == {"source": str(good), "sha256": hashlib.sha256(good.read_bytes()).hexdigest(),
                                   "rules": [{"structure": "organs", "metric": "Dmean", "within_gy": 4.0,
                                              "fraction": 0.9},
                                             {"structure": "PTV70", "metric": "D95", "within_gy": 2.0,
                                              "fraction": 0.95}],
                                   "words": "each organ's Dmean within 4 Gy of the plan for 90 % of patients; PTV70's "
                                            "D95 within 2 Gy of the plan for 95 % of patients"}
    assert [(c["structure"], c["metric"], c["needed"]) for c in found["cells"]] == [
        *[(name, "Dmean", 10) for name in openkbp().oars], ("PTV70", "D95", 20)]
    card = (model / "commissioning" / "MODEL_CARD.md").read_text()
    assert f"by the tolerances of {good} (SHA-256 `{found['tolerances']['sha256']}`)" in card


# -- what commissioning certifies: the folds' recipes and the data they trained on ---------------------------------

def _edit_config(model, fold: int, **fields) -> None:
    """Fold ``fold``'s config.json with ``fields`` changed (as a fold trained otherwise, or copied
    from another model, holds them: no checkpoint or prediction changes)."""
    path = model / f"fold-{fold}" / "models" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


@pytest.mark.slow
def test_a_fold_of_another_recipe_is_refused_naming_the_setting_and_the_folds(commissioned, tmp_path, phantom_data,
                                                                            phantom_cache):
    """Fold 2 from a model trained at another rate passes every SHA-256 check: its recipe does not."""
    model = _copy(commissioned, tmp_path)
    rate = json.loads((model / "fold-1" / "models" / "config.json").read_text())["learning_rate"]
    _edit_config(model, 2, learning_rate=2e-3)
    with pytest.raises(CommissioningError, match=rf"^Cannot commission cv: its folds were not trained alike "
                                                 rf"\(learning_rate: {rate!r} in fold 1, 0\.002 in fold 2\)\. If the "
                                                 rf"mix is meant, pass --allow-mixed-recipes") as refused:
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    assert "--change-recipe" not in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.slow
def test_a_mix_commissioned_on_purpose_lists_each_folds_recipe_on_the_card(commissioned, tmp_path, phantom_data,
                                                                          phantom_cache):
    """A fold retrained with --change-recipe: refused as a mix (its rate and its history), and with
    --allow-mixed-recipes its card lists each fold's rate and changes, not fold 1's for all."""
    model = _copy(commissioned, tmp_path)
    rate = json.loads((model / "fold-1" / "models" / "config.json").read_text())["learning_rate"]
    change = {"epoch": 1, "field": "learning_rate", "from": rate, "to": 2e-3}
    _edit_config(model, 2, learning_rate=2e-3, history=[change])
    with pytest.raises(CommissioningError, match=r"not trained alike \(learning_rate: .*; history: none in fold 1, "
                                                 r"learning_rate .* -> 0\.002 from epoch 1 in fold 2\)"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    commission(model, data_dir=phantom_data, cache_dir=phantom_cache, allow_mixed_recipes=True)
    card = json.loads((model / "commissioning" / "model_card.json").read_text())
    assert card["settings_by_fold"]["learning_rate"] == {"1": repr(rate), "2": "0.002"}
    assert "learning_rate" not in card["settings"] and card["recipe_changes"] == {"2": [change]}
    text = (model / "commissioning" / "MODEL_CARD.md").read_text()
    assert "**The folds were not trained alike** (commissioned with --allow-mixed-recipes)" in text
    assert f"| learning_rate | {rate!r} | 0.002 |" in text
    assert f"- Fold 2's recipe changed on a resume (--change-recipe): learning_rate {rate!r} -> 0.002 from epoch 1." \
        in text


@pytest.mark.slow
def test_a_fold_copied_from_another_model_is_refused_by_its_name(commissioned, tmp_path, phantom_data, phantom_cache):
    model = _copy(commissioned, tmp_path)
    _edit_config(model, 2, model_name="hn")
    with pytest.raises(CommissioningError, match=r"not trained alike \(model_name: 'cv' in fold 1, 'hn' in fold 2\)"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_a_fold_folder_of_another_dealing_is_told_a_command_that_trains_it_anew(commissioned, tmp_path, phantom_data,
                                                                              phantom_cache):
    """fold-2/ copied from a model whose patients were dealt with another --seed: its held-out
    patients are not fold 2's. Running fold 2's command again would resume the copy (and be refused
    for its seed); the advice given, with the other folds' settings, trains it anew, and the model
    then commissions."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli
    from tests.conftest import CV_RUN
    from tests.kit.runs import forget_models

    model = _copy(commissioned, tmp_path)
    _edit_config(model, 2, seed=3)
    with pytest.raises(CommissioningError) as refused:
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)
    message = str(refused.value)
    assert message.startswith(f"Cannot commission cv: {model / 'fold-2'} holds fold 2 of 2 of model 'cv', dealt with "
                              f"--seed 3 ({model / 'fold-2' / 'models' / 'config.json'}), not fold 2 of its 2 folds "
                              f"dealt with --seed 0")
    assert "command again" not in message
    flags = re.search(r"train fold 2 anew: (.*) --start-over, with the other folds' settings", message).group(1).split()
    settings = [word for word in CV_RUN if word not in ("--model-name", "cv", "--folds", "2")]
    result = CliRunner().invoke(cli.main, [*settings, *flags, "--start-over", "--data-dir", str(phantom_data),
                                           "--cache-dir", str(phantom_cache)])
    forget_models()
    assert result.exit_code == 0, result.output
    assert list((model / "fold-2").glob("abandoned-*/config.json"))  # the copy's files moved aside
    commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_each_fold_records_the_files_of_the_patients_it_trained_on(commissioned):
    model, report = commissioned
    dealing = read_dealing(model)
    for fold in (1, 2):
        versions = json.loads((model / f"fold-{fold}" / "models" / "trained_on.json").read_text())["versions"]
        assert [version["from_epoch"] for version in versions] == [1]
        trained = versions[0]["patients"]
        assert sorted(trained) == sorted(dealing.held_out_of(3 - fold))  # the other fold's patients
        for pid, files in trained.items():
            folder = Path(versions[0]["split"]) / pid
            assert files == {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
                             for path in folder.iterdir() if path.suffix == ".csv"}
    said = report.report["trained_on"]
    assert said["recorded_by"] == [1, 2] and said["not_recorded_by"] == [] and said["checked"] == "every file"
    card = (model / "commissioning" / "MODEL_CARD.md").read_text()
    assert (f"The training patients' files (of {said['data']}), together: SHA-256 `{said['sha256']}`") in card
    assert "Folds 1 and 2 recorded the SHA-256 of every file of each patient they trained on" in card


@pytest.mark.slow
def test_folds_trained_on_different_versions_of_a_plan_are_refused_naming_the_patient_and_folds(cv_model, tmp_path,
                                                                                               phantom_data):
    """Fold 1 trained on a patient's plan (``cv_model``'s fold 1: CV_RUN's on the phantoms, a copy of
    which fold 2 trains on); the plan was halved; fold 2, which holds the patient out, predicted it
    against the halved one: each fold's checks pass, but the folds disagree."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli
    from provided_code.data.csv_io import write_sparse_csv
    from tests.conftest import CV_RUN
    from tests.kit.runs import forget_models

    data = tmp_path / "data"
    shutil.copytree(phantom_data, data)
    common = [*CV_RUN, "--data-dir", str(data), "--results-dir", str(tmp_path / "results"), "--cache-dir",
              str(tmp_path / "cache")]
    model = tmp_path / "results" / "cv"
    shutil.copytree(cv_model, model, ignore=lambda folder, names: ["fold-2"] if Path(folder) == cv_model else [])
    patient = read_dealing(model).held_out_of(2)[0]  # trained on by fold 1
    dose = data / "train-pats" / patient / "dose.csv"
    indices, values = read_sparse_csv(dose, patient, with_values=True)
    write_sparse_csv(dose, indices, (values * 0.5).astype(np.float32))
    result = CliRunner().invoke(cli.main, [*common, "--fold", "2"])
    forget_models()
    assert result.exit_code == 0, result.output
    with pytest.raises(CommissioningError, match=rf"^Cannot commission cv: its folds disagree about the files of "
                                                 rf"{patient}: its dose\.csv \(SHA-256 [0-9a-f]{{12}}… in fold 1's "
                                                 rf"training; SHA-256 [0-9a-f]{{12}}… in fold 2's out-of-fold "
                                                 rf"prediction and {re.escape(str(data / 'train-pats'))} now\)\. A "
                                                 rf"model's folds are trained and assessed on one version"):
        commission(model, data_dir=data, cache_dir=tmp_path / "cache")


@pytest.mark.slow
def test_a_contour_or_ct_changed_since_the_folds_predicted_is_refused_naming_the_files(commissioned, tmp_path,
                                                                                       phantom_data):
    """The DVH values, the anatomy features and the cohort are computed from the structures and the
    CT, not only the plan: a changed contour or CT is caught as a changed dose.csv is."""
    from provided_code.data.csv_io import write_sparse_csv

    model, data = _copy(commissioned, tmp_path), tmp_path / "data"
    shutil.copytree(phantom_data, data)
    first, second = sorted(read_dealing(model).patients)[:2]
    structure = data / "train-pats" / first / "Brainstem.csv"
    lines = structure.read_text().splitlines()
    structure.write_text("\n".join(lines[:-1]) + "\n")  # one voxel fewer
    ct = data / "train-pats" / second / "ct.csv"
    indices, values = read_sparse_csv(ct, second, with_values=True)
    write_sparse_csv(ct, indices, values + 300)  # a scanner off by 300 HU
    with pytest.raises(CommissioningError, match=rf"^Cannot commission cv: the files of {first} \(Brainstem\.csv\), "
                                                 rf"{second} \(ct\.csv\) in {re.escape(str(data / 'train-pats'))} "
                                                 rf"changed since the folds predicted them"):
        commission(model, data_dir=data, cache_dir=tmp_path / "cache")


@pytest.mark.slow
def test_a_model_trained_before_folds_recorded_their_data_commissions_as_before_and_says_so(
        commissioned, tmp_path, phantom_data, phantom_cache):
    """Folds without trained_on.json, whose out-of-fold predictions recorded only the plans' SHA-256:
    the same figures, the plans still checked, and the card says what was not recorded."""
    model = _copy(commissioned, tmp_path)
    for fold in (1, 2):
        (model / f"fold-{fold}" / "models" / "trained_on.json").unlink()
        scores = model / f"fold-{fold}" / "held-out-predictions" / "scores.json"
        saved = json.loads(scores.read_text())
        sources = saved["made_with"].pop("sources")
        saved["made_with"]["plans"] = {pid: files["dose.csv"] for pid, files in sources.items()}
        scores.write_text(json.dumps(saved))
    report = commission(model, data_dir=phantom_data, cache_dir=phantom_cache).report
    before = commissioned[1].report
    assert report["scores"] == before["scores"] and report["plans"] == before["plans"]
    assert report["summary"] == before["summary"] and report["geometric_scores"] == before["geometric_scores"]
    card = (model / "commissioning" / "MODEL_CARD.md").read_text()
    assert ("- Folds 1 and 2 did not record their training data (trained before runs recorded it): what they trained "
            "on is not known.") in card
    assert "their plans (dose.csv) only, by SHA-256" in card
    scores = model / "fold-1" / "held-out-predictions" / "scores.json"
    saved = json.loads(scores.read_text())
    patient = sorted(saved["made_with"]["plans"])[0]
    saved["made_with"]["plans"][patient] = "0" * 64  # another plan than the one there now
    scores.write_text(json.dumps(saved))
    with pytest.raises(CommissioningError, match=rf"the files of {patient} \(dose\.csv\) in .* changed since"):
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)


@pytest.mark.slow
def test_a_model_named_by_a_path_that_ends_in_dot_dot_is_named_by_its_folder(commissioned, tmp_path, phantom_data,
                                                                           phantom_cache):
    model = _copy(commissioned, tmp_path)
    report = commission(model / "fold-1" / "..", data_dir=phantom_data, cache_dir=phantom_cache)
    assert report.report["model"] == "cv" and report.summary().startswith("Commissioned cv (openkbp)")
    assert (model / "commissioning" / "MODEL_CARD.md").read_text().startswith("# Model card: cv\n")


@pytest.mark.slow
def test_bands_and_cohort_edited_after_commissioning_are_refused_when_read(commissioned, tmp_path):
    """The card binds both files by SHA-256: residuals set to 0 or alpha set to 0.9 by hand are not
    used as if commissioning had written them."""
    from provided_code.trust import BANDS_FILE, COHORT_FILE, TrustError

    model = _copy(commissioned, tmp_path)
    folder = model / "commissioning"
    card = json.loads((folder / "model_card.json").read_text())
    assert card["files"] == {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
                             for name in (COHORT_FILE, BANDS_FILE)}
    assert f"| bands.json | `{card['files']['bands.json']}` |" in (folder / "MODEL_CARD.md").read_text()
    DeployedModel.open(model).trust(0.5)  # as written: read
    cohort = json.loads((folder / COHORT_FILE).read_text())
    (folder / COHORT_FILE).write_text(json.dumps({**cohort, "alpha": 0.9}))
    with pytest.raises(TrustError, match=rf"^{re.escape(str(folder / COHORT_FILE))} changed since the model was "
                                         rf"commissioned \(SHA-256 [0-9a-f]{{12}}…, its model_card\.json records "
                                         rf"{card['files']['cohort.json'][:12]}…\)"):
        DeployedModel.open(model).trust(0.5)
    shutil.copy(commissioned[0] / "commissioning" / COHORT_FILE, folder / COHORT_FILE)
    bands = json.loads((folder / BANDS_FILE).read_text())
    bands["residuals"] = {s: {m: [0.0] * len(v) for m, v in metrics.items()} for s, metrics in bands["residuals"].items()}
    (folder / BANDS_FILE).write_text(json.dumps(bands))
    with pytest.raises(TrustError, match=rf"^{re.escape(str(folder / BANDS_FILE))} changed since"):
        DeployedModel.open(model).trust(0.5)
