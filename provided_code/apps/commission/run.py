"""``openkbp-commission``: a cross-validated model's commissioning, from its run folders alone.

Every training patient has one out-of-fold prediction, written by the fold that never saw it
(``fold-<K>/held-out-predictions/``, :func:`provided_code.apps.predict.predict_held_out`); nothing
is predicted again here. Against each patient's plan (its ``dose.csv``) they give, per structure
and DVH metric (the site's, and the clinical D99, D95, D50, Dmean, D1, Dmax), the plan's value, the
prediction's, their difference and its standardised residual; per structure and metric the bias,
spread, mean absolute error and R²; the dose and DVH scores of the out-of-fold predictions; the
site's clinical goals met by the plans and by the predictions; the dosimetric outliers (plans far
from what the model predicts for their anatomy) and the geometric ones (anatomies unlike the
cohort's, from features computed once per patient); and the verdict: the physicist's tolerances
(``--tolerances FILE``, :mod:`provided_code.tolerances`; its defaults without) judged per
structure-metric, which pass, which fail, and "not fit for clinical use" when any fails.
:mod:`provided_code.metrics.commissioning` and :mod:`provided_code.metrics.anatomy` hold the
arithmetic; :mod:`.report` draws the page.

``results/<model>/commissioning/`` (written beside its place and moved in whole)::

    plans.csv          patient, structure, metric, plan, predicted, difference, z
    summary.csv        per structure and metric: n, bias, sd, mae, r2
    anatomy.csv        the anatomy features of every training patient
    cohort.json        the cohort's statistics the in-distribution check of a new patient needs
    bands.json         per structure and metric the sorted out-of-fold residuals a prediction's
                       band is computed from (provided_code/trust.py: both files' home)
    report.json        every figure of the report (flagged patients under dosimetric_outliers and
                       geometric_outliers, each with its reason; the bands' coverage on the
                       validation split under calibration, each cell with its binomial range;
                       the tolerances and their judgement under verdict)
    report.html        one self-contained page, read top to bottom
    MODEL_CARD.md      what the model was trained on and how well it did (and model_card.json, which
                       binds bands.json and cohort.json by their SHA-256: provided_code/trust.py)

Before anything is measured, what it measures is certified: the folds were trained alike
(:data:`COMPARED`; ``allow_mixed_recipes`` when a mix is meant), each fold folder holds its fold of
this dealing, each checkpoint is the one that made its fold's out-of-fold predictions, each
prediction file the one its fold wrote, each held-out patient's files (every file its figures are
computed from) the ones it was predicted against, and the folds agree about every training
patient's files (:mod:`provided_code.data.provenance`: what each fold recorded it trained on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from provided_code.apps.commission.card import model_card
from provided_code.apps.commission.report import render_report
from provided_code.apps.score_folder import SparseDoses, read_prediction
from provided_code.config import TrainConfig
from provided_code.data.cache import load_split
from provided_code.data import provenance
from provided_code.data.csv_io import exact_dose
from provided_code.data_folder import split_dir
from provided_code.deployed_model import DeployedModel, Member, recorded_members
from provided_code.errors import UserError
from provided_code.exclusions import excluded_patients, split_patients
from provided_code.constants import DOSE_FILE
from provided_code.folds import (HELD_OUT_STAGE, MADE_WITH, SPLITS_FILE, Dealing, check_patients, fold_dir,
                                 fold_folder_name, fold_folders, natural_key, read_dealing)
from provided_code.infra.checksum import file_checksum
from provided_code.infra.atomic import naming_path, new_folder_beside, replace_folder
from provided_code.infra.progress import Progress, no_progress
from provided_code.metrics import anatomy, calibration, commissioning
import provided_code.tolerances as tolerance_file
from provided_code.metrics.dvh_table import CLINICAL_METRICS, clinical_dvh
from provided_code.metrics.scoring import score_split, structure_indices
from provided_code.run_folder import SCORES_FILE, CheckpointError, RunFolder, read_scores
from provided_code.trust import BANDS_FILE, CARD_FILE, COHORT_FILE, bands_record, commissioning_folder

logger = logging.getLogger(__name__)

VALIDATION_STAGE = "validation"  # the split whose ensemble predictions show the bands' coverage
FILES = {"plans": "plans.csv", "summary": "summary.csv", "anatomy": "anatomy.csv", "cohort": COHORT_FILE,
         "bands": BANDS_FILE, "report_json": "report.json", "report_html": "report.html", "card": "MODEL_CARD.md",
         "card_json": CARD_FILE}


MIN_PATIENTS = 3  # the fewest training patients the statistics are made of (a robust scale, a cohort)


class CommissioningError(UserError, RuntimeError):
    """A model that cannot be commissioned yet: one line naming the fold and what it lacks."""


@dataclasses.dataclass
class Fold:
    number: int
    folder: RunFolder
    config: TrainConfig
    epoch: int  # the epoch of its out-of-fold predictions (its final checkpoint made them)
    scores: dict  # its held-out scores.json, written with them

    @property
    def made_with(self) -> dict:
        """What made its out-of-fold predictions (:func:`provided_code.folds.held_out_record`)."""
        return self.scores[MADE_WITH]


@dataclasses.dataclass
class CommissioningReport:
    folder: Path
    report: dict

    def summary(self) -> str:
        report = self.report
        lines = [f"Commissioned {report['model']} ({report['site']}): {len(report['cohort']['patients'])} patients, "
                 f"{report['cohort']['folds']} folds.",
                 f"Verdict ({report['verdict']['tolerances']['source']}): {report['verdict']['words']}",
                 f"Out-of-fold dose score {report['scores']['dose_score']:.3f} Gy, DVH score "
                 f"{report['scores']['dvh_score']:.3f} Gy.",
                 f"Dosimetric outliers: {', '.join(o['patient'] for o in report['dosimetric_outliers']) or 'none'}.",
                 f"Geometric outliers: {', '.join(o['patient'] for o in report['geometric_outliers']) or 'none'}."]
        check = (report.get("calibration") or {}).get("range_check")
        if check:
            lines.append(f"Band calibration: {check['outside']} of {check['cells']} structure-metric cells outside "
                         f"their binomial 95 % range ({check['expected']:.1f} expected by chance).")
        if report["thresholds"].get("geometric_note"):
            lines.append(f"In-distribution check: {report['thresholds']['geometric_note']}.")
        lines += [f"{name}: {self.folder / FILES[key]}" for key, name in (
            ("report_html", "Report"), ("report_json", "Figures"), ("plans", "Plans"), ("card", "Model card"))]
        return "\n".join(lines)


def complete_folds(model_dir: os.PathLike | str) -> tuple[Dealing, list[Fold]]:
    """The model's dealing and its folds, each trained to its ``--epochs`` with its out-of-fold
    predictions written by its best checkpoint (its newest without one); a
    :class:`CommissioningError` naming every fold that is missing or unfinished, and what to run."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        missing = "is not a folder" if model_dir.exists() else "does not exist"
        raise CommissioningError(f"Invalid `model_dir`. Expected a cross-validated model's folder (results/<model>). "
                                 f"Received: {model_dir}, which {missing}")
    dealing = read_dealing(model_dir)
    if dealing is None:
        raise CommissioningError(f"{model_dir} is not a cross-validated model (no splits.json): train its folds with "
                                 f"--folds N --fold K, K = 1..N")
    folds, problems = [], []
    configs = {number: RunFolder(fold_dir(model_dir, number)).read_config() for number in range(1, dealing.folds + 1)}
    excluded = set().union(*(excluded_patients(config.excluded) for config in configs.values() if config is not None))
    for number in range(1, dealing.folds + 1):
        folder = RunFolder(fold_dir(model_dir, number))
        config = configs[number]
        newest = folder.checkpoints()
        if config is None and not dealing.held_out_of(number, excluded):
            held = ", ".join(dealing.held_out_of(number))
            raise CommissioningError(f"Cannot commission {model_dir.name}: fold {number}'s held-out patients ({held}) "
                                     f"are all excluded (--exclude), so the fold cannot be trained (it would have "
                                     f"none to hold out). Deal the patients again: train the folds as a new "
                                     f"--model-name with another --seed or fewer --folds.")
        if config is None or not newest:
            problems.append(f"fold {number} is not trained ({folder.path})")
            continue
        _check_belongs(model_dir, dealing, number, folder, config)
        if newest[0][0] < config.epochs:
            problems.append(f"fold {number} is trained to epoch {newest[0][0]} of {config.epochs}")
            continue
        path = folder.predictions(HELD_OUT_STAGE) / SCORES_FILE
        expected = newest[0][0]  # a fold's model is its final checkpoint (RunFolder.epoch_to_apply)
        scores = read_scores(path, ("dose_score", "dvh_score", "patients")) if path.is_file() else {}
        if scores.get("epoch") != expected:
            problems.append(f"fold {number} has no out-of-fold predictions of its epoch {expected} "
                            f"({folder.predictions(HELD_OUT_STAGE)})")
            continue
        if not isinstance(scores.get(MADE_WITH), dict):
            problems.append(f"fold {number}'s out-of-fold predictions do not record the checkpoint that made them "
                            f"(written by an earlier version; {path})")
            continue
        folds.append(Fold(number, folder, config, expected, scores))
    if problems:
        raise CommissioningError(f"Cannot commission {model_dir.name} yet: {'; '.join(problems)}. Run the same "
                                 f"command with --fold K for each (it resumes, then writes the out-of-fold "
                                 f"predictions).")
    sites = {fold.config.site.name for fold in folds}
    if len(sites) > 1 or not all(fold.config.site.same_as(folds[0].config.site) for fold in folds):
        raise CommissioningError(f"The folds of {model_dir.name} are of different sites ({', '.join(sorted(sites))})")
    _check_exclusions(model_dir, folds)
    return dealing, folds


def _check_belongs(model_dir: Path, dealing: Dealing, number: int, folder: RunFolder, config: TrainConfig) -> None:
    """Fold ``number``'s folder holds this model's fold ``number``: its config.json names that fold
    of the dealing (``--folds`` and ``--seed``, splits.json), else a :class:`CommissioningError`
    saying what it holds (another fold's folder renamed, or a fold of another model copied in) and
    what to run: its held-out patients are not the ones the dealing gives it."""
    if (config.folds, config.fold, config.seed) == (dealing.folds, number, dealing.seed):
        return
    held = (f"fold {config.fold} of {config.folds} of model {config.model_name!r}, dealt with --seed {config.seed}"
            if config.folds else f"a single run of model {config.model_name!r}")
    if (config.folds, config.seed) == (dealing.folds, dealing.seed) and config.model_name == model_dir.name:
        advice = (f"put each fold's folder back under its own name ({fold_folder_name(config.fold)}/ for fold "
                  f"{config.fold}), or train fold {number} anew")
    else:
        advice = f"train fold {number} anew"
    raise CommissioningError(
        f"Cannot commission {model_dir.name}: {folder.path} holds {held} ({folder.config_file}), not fold {number} "
        f"of its {dealing.folds} folds dealt with --seed {dealing.seed} ({model_dir / SPLITS_FILE}), so its held-out "
        f"patients are not fold {number}'s: {advice}: {_fold_command(model_dir, dealing, number)} --start-over, "
        f"with the other folds' settings (--start-over moves the folder's files aside).")


def _fold_command(model_dir: Path, dealing: Dealing, number: int) -> str:
    """The flags that train fold ``number`` of the model in ``model_dir`` (the settings aside)."""
    return (f"--model-name {model_dir.name} --results-dir {model_dir.parent} --folds {dealing.folds} "
            f"--fold {number} --seed {dealing.seed}")


def _check_exclusions(model_dir: Path, folds: list[Fold]) -> None:
    """Every fold left out the same patients (``--exclude``), or a :class:`CommissioningError`
    naming the folds that differ: a patient one fold excluded and another trained on is neither
    excluded from the model nor assessed as one of its training patients."""
    lists = {fold.number: sorted(excluded_patients(fold.config.excluded), key=natural_key) for fold in folds}
    first = folds[0].number
    differing = [number for number, patients in lists.items() if patients != lists[first]]
    if differing:
        said = "; ".join(f"fold {number}: {', '.join(patients) or 'none'}" for number, patients in lists.items())
        raise CommissioningError(f"The folds of {model_dir.name} left out different patients with --exclude ({said}): "
                                 f"a patient one fold excluded was trained on by another. Train the folds that differ "
                                 f"({', '.join(f'--fold {n}' for n in differing)}) again with the same --exclude file "
                                 f"as a new model, then commission it.")


# What each fold's config.json must agree on with the others' (--allow-mixed-recipes aside): the
# network (its site is compared first, the exclusions by _check_exclusions), the recipe, the recipe's
# changes on resumes (--change-recipe), where the weights started and the model's name.
COMPARED = (*(name for name in TrainConfig.NETWORK if name != "site"),
            *(name for name in TrainConfig.RECIPE if name != "excluded"), "history", "parent", "model_name")


def _fold_setting(config: TrainConfig, name: str):
    """A compared setting of a fold (:data:`COMPARED`) as it is compared and shown."""
    if name == "history":
        return "; ".join(f"{entry.get('field')} {entry.get('from')!r} -> {entry.get('to')!r} from epoch "
                         f"{entry.get('epoch')}" for entry in config.history) or "none"
    if name == "parent":
        parent = config.parent
        return (f"{parent.get('model')!r} epoch {parent.get('epoch')} (SHA-256 {str(parent.get('sha256'))[:12]}…)"
                if parent else "random weights")
    return config.shown(name)


def mixed_settings(folds: list[Fold]) -> dict[str, dict[int, str]]:
    """``{setting: {fold: value as shown}}`` of the :data:`COMPARED` settings that are not the same
    in every fold (empty: the folds were trained alike)."""
    mixed = {}
    for name in COMPARED:
        values = {fold.number: _fold_setting(fold.config, name) for fold in folds}
        if len(set(values.values())) > 1:
            mixed[name] = values
    return mixed


def _check_recipes(model_dir: Path, folds: list[Fold], allow_mixed: bool) -> dict[str, dict[int, str]]:
    """The settings the folds differ in (:func:`mixed_settings`); a :class:`CommissioningError`
    naming them, each with its folds' values, unless ``allow_mixed`` (``--allow-mixed-recipes``:
    then said in the log, and the card lists each fold's)."""
    mixed = mixed_settings(folds)
    if not mixed:
        return mixed
    said = "; ".join(f"{name}: " + ", ".join(
        f"{value} in {_folds_named(numbers)}" for value, numbers in _by_value(values).items())
                     for name, values in mixed.items())
    if allow_mixed:
        logger.warning("The folds of %s were not trained alike (%s): commissioned as one model (--allow-mixed-recipes)",
                       model_dir.name, said)
        return mixed
    raise CommissioningError(
        f"Cannot commission {model_dir.name}: its folds were not trained alike ({said}). If the mix is meant, pass "
        f"--allow-mixed-recipes (the model card then lists each fold's settings); else train the folds that differ "
        f"anew with the others' settings (each fold's command with --start-over, which moves its files aside).")


def _by_value(values: dict[int, str]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for number, value in values.items():
        grouped.setdefault(value, []).append(number)
    return grouped


def _folds_named(numbers: list[int]) -> str:
    """``fold 2``, ``folds 1 and 3``, ``folds 1, 2 and 4``."""
    if len(numbers) == 1:
        return f"fold {numbers[0]}"
    return f"folds {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def certify(model: DeployedModel, folds: list[Fold]) -> list[dict]:
    """Each fold's identity (:meth:`provided_code.deployed_model.Member.identity`: its fold, epoch
    and the SHA-256 of its checkpoint, as ``model``, the folds deployed, hashed them), certified to
    be the checkpoint that made its out-of-fold predictions, and a model of its own; a
    :class:`CommissioningError` naming the first fold whose checkpoint is byte-identical to another
    fold's, differs from the one recorded with its predictions, or does not load. ``model``'s
    members are ``folds``' own, in order (else a ValueError: no fold is certified by another's)."""
    if [member.fold for member in model.members] != [fold.number for fold in folds]:
        raise ValueError(f"Invalid `model`. Expected the members of folds {', '.join(str(f.number) for f in folds)}, "
                         f"in order. Received: model={model.name!r} of "
                         f"{', '.join(f'{m.name} (fold {m.fold})' for m in model.members)}")
    identities, seen = [], {}
    for fold, member in zip(folds, model.members, strict=True):
        identity = member.identity()
        checkpoint = member.checkpoint
        twin = seen.setdefault(identity["sha256"], fold.number)
        if twin != fold.number:
            raise CommissioningError(f"Cannot commission: fold {fold.number}'s checkpoint {checkpoint} is byte-identical "
                                     f"to fold {twin}'s (SHA-256 {identity['sha256'][:12]}…): each fold is a model of "
                                     f"its own; train fold {fold.number} again (--fold {fold.number}) or restore its "
                                     f"checkpoint.")
        recorded = fold.made_with["checkpoint"]
        if (recorded.get("epoch"), recorded.get("sha256")) != (fold.epoch, identity["sha256"]):
            raise CommissioningError(f"Cannot commission: fold {fold.number}'s checkpoint {checkpoint} is not the one "
                                     f"that made its out-of-fold predictions (SHA-256 {identity['sha256'][:12]}…, "
                                     f"recorded {str(recorded.get('sha256'))[:12]}… at epoch {recorded.get('epoch')}): "
                                     f"restore it, or run fold {fold.number}'s command again to predict its held-out "
                                     f"patients with it.")
        identities.append(identity)
    for fold, member in zip(folds, model.members, strict=True):  # the members load, as a prediction loads them
        _check_loads(fold.number, member)
    return identities


def _check_loads(number: int, member: Member) -> None:
    import keras

    try:
        trained = member.load()
        del trained
    except Exception as error:  # whatever Keras, h5py or zipfile raise for a damaged file
        raise CommissioningError(f"Cannot commission: fold {number}'s checkpoint {member.checkpoint} does not load "
                                 f"({type(error).__name__}: {' '.join(str(error).split())[:300]}): restore it, or train fold "
                                 f"{number} again.") from None
    finally:
        keras.backend.clear_session()


def _check_predictions_and_plans(model_dir: Path, folds: list[Fold], fold_of: dict, patients: list[str],
                                 split: Path, now: dict[str, dict[str, str]]) -> None:
    """Each out-of-fold prediction file is the one its fold wrote, and each patient's files (``now``:
    ``{patient: {file name: SHA-256}}`` as read for this commissioning) the ones it was predicted
    against (:func:`provided_code.folds.held_out_record`: every file its figures are computed from;
    of predictions written before, only the plan, ``dose.csv``); a :class:`CommissioningError`
    naming the fold and file, or the patients whose files changed and which."""
    changed = []
    for pid in patients:
        fold = folds[fold_of[pid] - 1]
        made_with = fold.made_with
        path = fold.folder.predictions(HELD_OUT_STAGE) / f"{pid}.csv"
        recorded = made_with.get("predictions", {}).get(pid)
        found = file_checksum(path) if path.is_file() else None
        if found is None or found != recorded:
            what = ("is missing" if found is None else "was not recorded with its predictions" if recorded is None
                    else f"changed since the fold wrote it (SHA-256 {found[:12]}…, recorded {recorded[:12]}…)")
            raise CommissioningError(f"Cannot commission: fold {fold.number}'s out-of-fold prediction {path} {what}: run "
                                     f"fold {fold.number}'s command again to predict its held-out patients anew.")
        then, current = _recorded_sources(made_with, pid), now.get(pid, {})
        if "sources" not in made_with:  # a record of the plans alone
            current = {DOSE_FILE: current.get(DOSE_FILE)}
        files = provenance.differing_files(then or {}, current)
        if files:
            changed.append(f"{pid} ({', '.join(files)})")
    if changed:
        raise CommissioningError(f"Cannot commission {model_dir.name}: the files of {_listed(changed)} in {split} "
                                 f"changed since the folds predicted them (their SHA-256 differs from the one recorded "
                                 f"with the out-of-fold predictions): commission with the data folder the folds were "
                                 f"trained on (--data-dir), or train the folds again on this one as a new model.")


def _recorded_sources(made_with: dict, pid: str) -> dict[str, str] | None:
    """The files of ``pid`` as its out-of-fold prediction's record has them: every file's SHA-256,
    or (a record written before) its plan's, ``{"dose.csv": SHA-256}``; None: not recorded."""
    if "sources" in made_with:
        return made_with["sources"].get(pid)
    plan = made_with.get("plans", {}).get(pid)
    return None if plan is None else {DOSE_FILE: plan}


def _check_training_data(model_dir: Path, folds: list[Fold], fold_of: dict, patients: list[str],
                         now: dict[str, dict[str, str]], split: Path) -> dict:
    """Every fold trained on the same files of each patient, and the fold that held it out predicted
    it against them too (:mod:`provided_code.data.provenance`: each fold's ``trained_on.json`` and
    its out-of-fold predictions' record); a :class:`CommissioningError` naming the first patient
    the folds disagree about, the file, and which fold had which. Returns what the report and the
    card say of the data: the folds that recorded it (and those trained before runs did: nothing to
    compare), the split folders they read, and one SHA-256 of the patients' files."""
    accounts: dict[str, dict[str, dict[str, str]]] = {pid: {} for pid in patients}
    recorded, splits = [], {}
    for fold in folds:
        versions = provenance.read_training(fold.folder.trained_on)
        if versions is None:
            continue
        recorded.append(fold.number)
        splits[fold.number] = list(dict.fromkeys(version["split"] for version in versions))
        for version in versions:
            who = f"fold {fold.number}'s training" + (f" from epoch {version['from_epoch']}" if len(versions) > 1 else "")
            for pid, files in version["patients"].items():
                if pid in accounts:
                    accounts[pid][who] = files
    for pid in patients:
        held_by = folds[fold_of[pid] - 1]
        if "sources" in held_by.made_with and pid in held_by.made_with["sources"]:
            accounts[pid][f"fold {held_by.number}'s out-of-fold prediction"] = held_by.made_with["sources"][pid]
        if accounts[pid] and pid in now:
            accounts[pid][f"{split} now"] = now[pid]
    found = [(pid, provenance.disagreement(accounts[pid])) for pid in patients]
    found = [(pid, where) for pid, where in found if where is not None]
    if found:
        pid, (name, groups) = found[0]
        said = "; ".join(f"{'absent' if sha is None else f'SHA-256 {sha[:12]}…'} in {_joined(who)}"
                         for sha, who in groups.items())
        others = [other for other, _ in found[1:]]
        raise CommissioningError(
            f"Cannot commission {model_dir.name}: its folds disagree about the files of {pid}: its {name} ({said})"
            + (f"; {len(others)} other patient(s) differ too ({_listed(others)})" if others else "")
            + ". A model's folds are trained and assessed on one version of each patient: train the folds again on "
              "one data folder, as a new --model-name, then commission it.")
    return {"recorded_by": recorded, "not_recorded_by": [fold.number for fold in folds if fold.number not in recorded],
            "splits": {str(number): folders for number, folders in splits.items()},
            "checked": "every file" if all("sources" in fold.made_with for fold in folds) else "dose.csv",
            "sha256": provenance.digest({pid: now[pid] for pid in patients if pid in now}),
            "data": str(Path(split).resolve())}


def _joined(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _listed(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def commission(model_dir: os.PathLike | str, data_dir: os.PathLike | str | None = None,
               cache_dir: os.PathLike | str | None = None, progress: Progress = no_progress,
               alpha: float = anatomy.DEFAULT_ALPHA, tolerances: os.PathLike | str | None = None,
               allow_mixed_recipes: bool = False) -> CommissioningReport:
    """Commission the cross-validated model in ``model_dir`` (``results/<model>``) and write
    ``commissioning/`` (the module docstring). ``data_dir``: where its training patients are (default:
    the folds' ``--data-dir``, as their config.json records it); ``cache_dir`` as training reads them;
    ``alpha``: the in-distribution check's level (recorded in cohort.json); ``tolerances``: the
    physicist's tolerance file (:mod:`provided_code.tolerances`; None: its defaults), read and
    checked against the folds' site before anything is measured; ``allow_mixed_recipes``: folds
    trained with other settings than one another (:data:`COMPARED`) are commissioned as one model,
    each fold's settings on the card (else refused, naming them).

    Meanwhile the model's folder is locked (another commissioning, or the folds' ensemble predicting
    the validation patients the calibration reads, is refused in one line) and each fold's is locked
    shared (a fold training is refused; a node serving the model is not)."""
    model_dir = Path(model_dir)
    if model_dir.name in ("", ".."):  # "." or "results/cv/fold-1/..": the model is named by the folder it is
        model_dir = model_dir.resolve()
    alpha = anatomy.check_alpha(alpha)
    judged_by = _Tolerances.read(tolerances)  # a bad file is refused before the model's folder is read
    with contextlib.ExitStack() as locks:
        if (model_dir / SPLITS_FILE).is_file():  # else complete_folds says what the folder is not
            locks.enter_context(RunFolder(model_dir).lock("commissioning",
                                                          advice="wait for it to end, then commission again"))
            for path in fold_folders(model_dir).values():
                locks.enter_context(RunFolder(path).lock(f"read by the commissioning of {model_dir.name!r}",
                                                         shared=True))
        return _commission(model_dir, data_dir, cache_dir, progress, alpha, judged_by, allow_mixed_recipes)


@dataclasses.dataclass(frozen=True)
class _Tolerances:
    rules: tuple  # of provided_code.tolerances.Tolerance
    source: str  # the file, or "the defaults"
    sha256: str | None  # the file's

    @classmethod
    def read(cls, path: os.PathLike | str | None) -> "_Tolerances":
        if path is None:
            return cls(tolerance_file.DEFAULTS, "the defaults", None)
        return cls(tolerance_file.read_tolerances(path), str(path), file_checksum(Path(path)))

    def record(self, plans: pd.DataFrame, site) -> dict:
        """The report's ``verdict``: :func:`provided_code.metrics.commissioning.verdict` of the
        plans, with the tolerances it judged by (their source, SHA-256 and rows)."""
        cells = [(structure, metric, rule.within_gy, rule.fraction)
                 for structure, metric, rule in tolerance_file.cells(self.rules, site)]
        return {**commissioning.verdict(plans, cells),
                "tolerances": {"source": self.source, "sha256": self.sha256,
                               "rules": [rule.to_dict() for rule in self.rules],
                               "words": tolerance_file.describe(self.rules)}}


def _commission(model_dir: Path, data_dir: os.PathLike | str | None, cache_dir: os.PathLike | str | None,
                progress: Progress, alpha: float, judged_by: _Tolerances, allow_mixed: bool) -> CommissioningReport:
    dealing, folds = complete_folds(model_dir)
    mixed = _check_recipes(model_dir, folds, allow_mixed)
    first = folds[0].config
    site = first.site
    tolerance_file.check_site(judged_by.rules, site, judged_by.source)
    data_dir = Path(data_dir) if data_dir is not None else Path(first.data_dir)
    excluded = {entry["patient"]: entry["reason"] for fold in folds for entry in fold.config.excluded}
    arrays = load_split(split_dir(data_dir, "train"), cache_dir=cache_dir, require_dose=True, progress=progress,
                        site=site, leave_out=set(excluded))  # an excluded patient's files may be why it was
    check_patients(dealing, split_patients(arrays.patient_ids, arrays.skipped, excluded), model_dir / SPLITS_FILE,
                   str(split_dir(data_dir, "train")))
    fold_of = {pid: dealing.fold_of(pid) for pid in dealing.patients}
    rows = [row for row, pid in enumerate(arrays.patient_ids) if pid not in excluded]
    if len(rows) < MIN_PATIENTS:
        raise CommissioningError(f"Cannot commission {model_dir.name}: {len(rows)} training patients once the excluded "
                                 f"are left out; the statistics need at least {MIN_PATIENTS}")
    commissioned = [arrays.patient_ids[row] for row in rows]
    now = arrays.sources_of() or {}  # every file of each patient, as read for this commissioning
    _check_predictions_and_plans(model_dir, folds, fold_of, commissioned, split_dir(data_dir, "train"), now)
    trained_on = _check_training_data(model_dir, folds, fold_of, commissioned, now, split_dir(data_dir, "train"))
    try:
        model = DeployedModel.open(model_dir)  # each fold at its final checkpoint, as it is deployed
    except CheckpointError as error:  # a fold's checkpoint that is not a complete .keras file, named
        raise CommissioningError(f"Cannot commission: {error}: restore it, or train its fold again.") from None
    identities = certify(model, folds)
    predictions = SparseDoses()
    for row in progress(rows, len(rows), "Reading out-of-fold predictions"):
        pid = arrays.patient_ids[row]
        predictions[row] = read_prediction(folds[fold_of[pid] - 1].folder.predictions(HELD_OUT_STAGE), pid)

    scores = score_split(arrays, lambda row: predictions[row], progress, rows=rows)
    plans = _plan_table(arrays, rows, predictions, scores, progress)
    residuals = commissioning.residuals(plans)
    summary = commissioning.fit_summary(plans)
    dosimetric = commissioning.dosimetric_outliers(residuals, kinds=site, metrics=site.metric_names)

    features = pd.DataFrame({arrays.patient_ids[row]: anatomy.anatomy_features(
        arrays.structure_masks[row], arrays.possible_dose_mask[row], arrays.voxel_dimensions[row], site, arrays.ct[row])
        for row in progress(range(len(arrays)), len(arrays), "Anatomy")}).T  # every training patient read, excluded too
    cohort = anatomy.fit_cohort(features.loc[[arrays.patient_ids[row] for row in rows]], alpha)
    geometric_scores = anatomy.cohort_scores(cohort)  # each patient left out of the cohort it is scored against
    small = anatomy.too_small(len(cohort["patients"]), cohort["alpha"])
    if small:
        logger.warning("In-distribution check: %s", small)
    geometric = [{"patient": pid, "score": float(entry["score"]), "threshold": cohort["threshold"],
                  "p_value": float(entry["p_value"]), "feature": entry["feature"],
                  "reasons": list(entry["reasons"])} for pid, entry in geometric_scores.iterrows() if entry["flagged"]]
    goals = commissioning.goal_table(plans, site.goals)
    bands = bands_record(residuals, site_name=site.name, folds=identities)
    calibration_figures = _calibration(model, folds, data_dir, cache_dir, bands, cohort, progress)

    flagged = list(dict.fromkeys([o["patient"] for o in dosimetric] + [o["patient"] for o in geometric]))
    row_of = {pid: row for row, pid in enumerate(arrays.patient_ids)}
    report = {
        "model": model_dir.name, "site": site.name, "site_description": site.description,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cohort": {"patients": [arrays.patient_ids[row] for row in rows], "folds": dealing.folds,
                   "fold_of": {arrays.patient_ids[row]: fold_of[arrays.patient_ids[row]] for row in rows},
                   "excluded": [{"patient": pid, "reason": reason} for pid, reason in excluded.items()],
                   "data": str(split_dir(data_dir, "train"))},
        "folds": [{"fold": fold.number, "epoch": fold.epoch, "held_out": list(dealing.held_out_of(fold.number)),
                   "scores": {key: fold.scores[key] for key in ("dose_score", "dvh_score", "patients")}}
                  for fold in folds],
        "scores": {"dose_score": scores.dose_score, "dvh_score": scores.dvh_score},
        "summary": _records(summary),
        "plans": _records(residuals),
        "thresholds": {"z": commissioning.Z_THRESHOLD, "geometric": cohort["threshold"], "alpha": cohort["alpha"],
                       **({"geometric_note": small} if small else {})},
        "dosimetric_outliers": dosimetric,
        "geometric_outliers": geometric,
        "geometric_scores": [{"patient": pid, "score": float(entry["score"])}
                             for pid, entry in geometric_scores.iterrows()],
        "goals": goals,
        "verdict": judged_by.record(plans, site),
        "dvh_curves": {pid: _dvh_curves(arrays, row_of[pid], predictions[row_of[pid]])
                       for pid in flagged if row_of[pid] in predictions},
        "calibration": calibration_figures,
        "trained_on": trained_on,
        "mixed_settings": {name: {str(number): value for number, value in values.items()}
                           for name, values in mixed.items()},
    }
    bound = {COHORT_FILE: _json(cohort).encode(), BANDS_FILE: _json(bands).encode()}  # what trust.py reads, bound
    card_text, card = model_card(model_dir, dealing, folds[0].config, identities, report,
                                 configs={fold.number: fold.config for fold in folds},
                                 files={name: hashlib.sha256(data).hexdigest() for name, data in bound.items()})
    folder = commissioning_folder(model_dir)
    new = new_folder_beside(folder)
    try:
        report = jsonable(report)
        writers = {"plans": lambda path: residuals.to_csv(path, index=False, float_format="%.4f"),
                   "summary": lambda path: summary.to_csv(path, index=False, float_format="%.4f"),
                   "anatomy": lambda path: features.to_csv(path, index_label="patient", float_format="%.6g"),
                   "cohort": lambda path: path.write_bytes(bound[COHORT_FILE]),
                   "bands": lambda path: path.write_bytes(bound[BANDS_FILE]),
                   "report_json": lambda path: path.write_text(_json(report)),
                   "report_html": lambda path: path.write_text(render_report(report)),
                   "card": lambda path: path.write_text(card_text),
                   "card_json": lambda path: path.write_text(_json(card))}
        for key, write in writers.items():
            with naming_path(folder / FILES[key], also=new / FILES[key]):  # a full disk's error names the file
                write(new / FILES[key])
        replace_folder(new, folder)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise
    logger.info("Wrote %s", folder)
    return CommissioningReport(folder, report)


def _calibration(model: DeployedModel, folds: list[Fold], data_dir: Path, cache_dir, bands: dict, cohort: dict,
                 progress: Progress) -> dict:
    """The report's ``calibration``: the bands' observed coverage on the validation split, as the
    folds' ensemble predicted it (``--predict-only --ensemble <model> --model-name <model>``:
    ``results/<model>/validation-predictions/``), at each nominal level of
    :data:`provided_code.metrics.calibration.LEVELS`, overall, per structure and per structure and
    metric (with the coverage exchangeable patients would have, ``exact``), and the in-distribution
    scores of the validation patients. Without those predictions (or made by other checkpoints than
    the commissioned ones): ``{"note": why}``."""
    model_dir = model.source
    folder = RunFolder(model_dir).predictions(VALIDATION_STAGE)
    command = (f"predict the validation split with the folds (--predict-only --stage {VALIDATION_STAGE} --ensemble "
               f"{model_dir.name} --model-name {model_dir.name}), then commission again")
    scores_path = folder / SCORES_FILE
    if not scores_path.is_file():
        return {"note": f"No scored validation predictions of the folds' ensemble ({scores_path} is missing): {command}."}
    written = read_scores(scores_path)
    made_with = recorded_members(written)  # checkpoints by SHA-256 where recorded (not by earlier versions)
    if ([member.get("epoch") for member in made_with] != [member.epoch for member in model.members]
            or any(then.get("sha256", now.sha256) != now.sha256
                   for then, now in zip(made_with, model.members, strict=True))):
        return {"note": f"The validation predictions in {folder} were not made by the {len(folds)} folds at their "
                        f"commissioned epochs ({', '.join(str(fold.epoch) for fold in folds)}): {command}."}
    site = folds[0].config.site
    stage_dir = split_dir(data_dir, VALIDATION_STAGE)
    if not stage_dir.is_dir():
        return {"note": f"The validation patients of {folder} are not in {stage_dir}: pass the data folder they "
                        f"were predicted from (--data-dir)."}
    arrays = load_split(stage_dir, cache_dir=cache_dir, require_dose=False, progress=progress, site=site)
    rows = [row for row, pid in enumerate(arrays.patient_ids) if (folder / f"{pid}.csv").is_file()]
    predictions = SparseDoses()  # the ensemble's validation doses, kept as their non-zero voxels
    for row in progress(rows, len(rows), "Reading validation predictions"):
        predictions[row] = read_prediction(folder, arrays.patient_ids[row])
    scored = [row for row in rows if arrays.has_dose[row]]
    in_distribution = [{"patient": arrays.patient_ids[row], **anatomy.check(cohort, anatomy.anatomy_features(
        arrays.structure_masks[row], arrays.possible_dose_mask[row], arrays.voxel_dimensions[row], site,
        arrays.ct[row]))} for row in rows]
    figures = {"split": str(stage_dir), "patients": [arrays.patient_ids[row] for row in scored],
               "levels": list(calibration.LEVELS), "method": calibration.METHOD,
               "calibration_patients": bands["patients"], "threshold": cohort["threshold"], "alpha": cohort["alpha"],
               "in_distribution": in_distribution}
    if not scored:
        return {**figures, "note": f"No validation patient of {stage_dir} has a dose: no coverage to observe."}
    scores = score_split(arrays, lambda row: predictions[row], progress, rows=scored)
    table = _plan_table(arrays, scored, predictions, scores, progress)
    covered = calibration.coverage_rows(table, bands["residuals"])
    by_pair = calibration.coverage_summary(covered, by=("structure", "metric"))
    by_pair["exact"] = [calibration.exact_coverage(len(bands["residuals"][s][m]), level)
                        for s, m, level in zip(by_pair["structure"], by_pair["metric"], by_pair["nominal"])]
    by_pair, range_check = calibration.range_check(by_pair)  # each cell against its binomial 95 % range
    return {**figures, "overall": _records(calibration.coverage_summary(covered)),
            "by_structure": _records(calibration.coverage_summary(covered, by=("structure",))),
            "by_structure_metric": _records(by_pair), "range_check": range_check}


def _plan_table(arrays, rows: list[int], predictions: dict, scores, progress: Progress) -> pd.DataFrame:
    """The long table of ``commissioning.residuals``' input: per patient, structure and metric
    (the site's, from the scores' tables; the clinical ones, on the 128³ grid), plan and prediction."""
    site = arrays.site
    records = []
    for slot, row in enumerate(progress(rows, len(rows), "DVH metrics")):
        pid = arrays.patient_ids[row]
        for k, structure in enumerate(site.names):
            for m, metric in enumerate(site.metric_names):
                plan, predicted = scores.reference[slot, k, m], scores.predicted[slot, k, m]
                if np.isfinite(plan) and np.isfinite(predicted):
                    records.append((pid, structure, metric, float(plan), float(predicted)))
        indices = structure_indices(arrays.structure_masks[row], len(site.names))
        plan_table = clinical_dvh(exact_dose(arrays.dose[row].reshape(-1), int(arrays.dose_decimals[row])), indices,
                                  site)
        predicted_table = clinical_dvh(predictions[row], indices, site)
        for structure, values in plan_table.items():
            records += [(pid, structure, metric, values[metric], predicted_table[structure][metric])
                        for metric in CLINICAL_METRICS]
    return pd.DataFrame(records, columns=["patient", "structure", "metric", "plan", "predicted"])


def _dvh_curves(arrays, row: int, prediction: np.ndarray) -> dict:
    """``{structure: {"plan": [[Gy, %], ...], "predicted": [...]}}``: each structure's cumulative DVH
    (:func:`provided_code.metrics.commissioning.dvh_curve`) under the plan and the prediction."""
    site = arrays.site
    indices = structure_indices(arrays.structure_masks[row], len(site.names))
    plan_dose = exact_dose(arrays.dose[row].reshape(-1), int(arrays.dose_decimals[row]))
    predicted_dose = np.asarray(prediction, np.float64).reshape(-1)
    return {name: {"plan": commissioning.dvh_curve(plan_dose[voxels]),
                   "predicted": commissioning.dvh_curve(predicted_dose[voxels])}
            for name, voxels in zip(site.names, indices) if voxels.size}


def _records(frame: pd.DataFrame) -> list[dict]:
    return frame.to_dict(orient="records")


def jsonable(value):
    """``value`` with numpy numbers as Python's, tuples as lists and NaN or infinity as None (JSON
    has neither)."""
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(item) for item in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (np.integer, bool)):
        return value if isinstance(value, bool) else int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if np.isfinite(value) else None
    return value


def _json(value) -> str:
    return json.dumps(jsonable(value), indent=1, allow_nan=False) + "\n"
