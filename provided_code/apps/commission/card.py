"""A model card (``MODEL_CARD.md`` and ``model_card.json``): what a cross-validated model was trained on
and how well it did, as a clinic's quality records need: first its verdict (the physicist's
tolerances judged per structure-metric: which pass, which fail, "not fit for clinical use" when any
fails), then its site, its patients (pseudonyms), the
patients left out and why, what they trained on (every file of every training patient, by SHA-256,
as each fold recorded it), its recipe and network (each fold's, when the folds were trained with
others, ``--allow-mixed-recipes``), the software that trained it, the folds' and the deployed
ensemble's scores, the commissioning's summary, and a checksum of every checkpoint it describes and
of the files predictions read (``bands.json``, ``cohort.json``: so that a file changed since is
found, and refused when read, :mod:`provided_code.trust`)."""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import platform
from pathlib import Path

from provided_code.config import TrainConfig
from provided_code.deployed_model import recorded_members
from provided_code.folds import Dealing, fold_dir
from provided_code.metrics.commissioning import CELL_VERDICTS, VERDICT_HEADS
from provided_code.run_folder import SCORES_FILE, RunFolder, checkpoint_change, read_scores, recorded_checkpoint
from provided_code.trust import BOUND

logger = logging.getLogger(__name__)

SOFTWARE = ("provided_code", "tensorflow", "keras", "numpy", "pandas", "h5py", "pydicom")


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in SOFTWARE:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _settings(config: TrainConfig) -> dict:
    """The settings that made the model: its network and inputs, its recipe, and how long."""
    chosen = {name: getattr(config, name) for name in (*TrainConfig.ARCHITECTURE, *TrainConfig.RECIPE, "epochs",
                                                        "batch_size", "accumulate", "precision")
              if name not in ("site", "excluded", "fold")}
    chosen["site"] = config.site.name
    return chosen


def _deployed(model_dir: Path) -> dict | None:
    """The scores of the folds as the deployed ensemble on the validation patients, when
    ``--predict-only --ensemble <model>`` wrote them into the model's folder."""
    path = RunFolder(model_dir).predictions("validation") / SCORES_FILE
    if not path.is_file():
        return None
    scores = read_scores(path)
    return {"stage": "validation", "dose_score": scores.get("dose_score"), "dvh_score": scores.get("dvh_score"),
            "patients": scores.get("patients"), "members": recorded_members(scores)}


def _parent(config: TrainConfig) -> dict | None:
    """The model the folds started from (``--init-from``; every fold alike), as their
    ``config.json`` records it, and whether its checkpoint is still the one recorded (a parent
    trained on since has another ``best.keras``): ``changed`` says how, and is logged."""
    if not config.parent:
        return None
    parent = dict(config.parent)
    parent["changed"] = checkpoint_change(parent)
    parent["checkable"] = recorded_checkpoint(parent).is_file()  # a parent gone (another machine) says nothing
    if parent["changed"] is not None:
        logger.warning("The parent of these folds, %r: its checkpoint %s", parent["model"], parent["changed"])
    return parent


def model_card(model_dir: os.PathLike | str, dealing: Dealing, first: TrainConfig, checkpoints: list[dict],
               report: dict, configs: dict[int, TrainConfig] | None = None,
               files: dict[str, str] | None = None) -> tuple[str, dict]:
    """``(markdown, card)`` of the model in ``model_dir``; ``first``: its first fold's config (the
    folds are trained alike, but for the settings the report's ``mixed_settings`` names);
    ``configs``: each fold's (``{K: config}``; None: ``first`` for all); ``checkpoints``: each
    fold's checkpoint as :meth:`provided_code.deployed_model.Member.identity` names it (fold, epoch,
    SHA-256); ``report``: the commissioning's figures (:mod:`.run`); ``files``: ``{name: SHA-256}``
    of the commissioning's files that predictions read, as written (the card binds them:
    :data:`provided_code.trust.BOUND`)."""
    model_dir = Path(model_dir)
    excluded = report["cohort"]["excluded"]
    mixed = report.get("mixed_settings") or {}
    settings = _settings(first)
    for name in mixed:
        settings.pop(name, None)
    card = {
        "model": model_dir.name,
        "written": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "site": {"name": first.site.name, "description": first.site.description},
        "patients": {"training": report["cohort"]["patients"],
                     "validation": "each fold's held-out patients (cross-validation); the deployed model is the "
                                   "folds as an ensemble",
                     "folds": {str(fold): list(dealing.held_out_of(fold)) for fold in range(1, dealing.folds + 1)},
                     "excluded": excluded,
                     "excluded_by": first.excluded_by or None,
                     "data": report["cohort"]["data"]},
        "settings": settings,
        "settings_by_fold": {name: dict(values) for name, values in mixed.items()},
        "recipe_changes": {str(number): list(config.history) for number, config in (configs or {}).items()
                           if config.history},
        "trained_on": report.get("trained_on"),
        "parent": _parent(first),
        "software": _versions(),
        "scores": {"out_of_fold": report["scores"], "folds": report["folds"], "deployed": _deployed(model_dir)},
        "verdict": _verdict(report),
        "commissioning": {"dosimetric_outliers": [o["patient"] for o in report["dosimetric_outliers"]],
                          "geometric_outliers": [o["patient"] for o in report["geometric_outliers"]],
                          "thresholds": report["thresholds"],
                          "goals": report["goals"]},
        "checkpoints": [{"fold": c["fold"], "epoch": c["epoch"], "path": str(
            RunFolder(fold_dir(model_dir, c["fold"])).checkpoint(c["epoch"]).relative_to(model_dir)),
                         "sha256": c["sha256"]} for c in checkpoints],
        BOUND: dict(files or {}),
    }
    return _markdown(card), card


def _markdown(card: dict) -> str:
    out = [f"# Model card: {card['model']}", "",
           f"Written {card['written']} by openkbp-commission.", "",
           *_verdict_markdown(card["verdict"]), "",
           "## Site", "", f"{card['site']['name']}: {card['site']['description']}", "",
           "## Patients", "",
           f"- Trained and cross-validated on {len(card['patients']['training'])} patients of "
           f"{card['patients']['data']}: {', '.join(card['patients']['training'])}.",
           f"- Validation: {card['patients']['validation']}."]
    out += [f"- Fold {fold} held out: {', '.join(patients)}." for fold, patients in card["patients"]["folds"].items()]
    if card["patients"]["excluded"]:
        out.append("- Excluded from training (and why):")
        out += [f"  - {entry['patient']}: {entry['reason']}" for entry in card["patients"]["excluded"]]
        if card["patients"]["excluded_by"]:
            out.append(f"  - asked by `{card['patients']['excluded_by'].get('command', '')}` "
                       f"(list: {card['patients']['excluded_by'].get('file', '')})")
    else:
        out.append("- Excluded from training: none.")
    out += _data_markdown(card["trained_on"])
    out += _parent_markdown(card["parent"])
    out += ["", "## Recipe and network", ""]
    by_fold = card["settings_by_fold"]
    if by_fold:
        out += ["**The folds were not trained alike** (commissioned with --allow-mixed-recipes): each fold's "
                "settings where they differ, then those they share.", ""]
        folds = sorted({fold for values in by_fold.values() for fold in values}, key=int)
        out += ["| setting | " + " | ".join(f"fold {fold}" for fold in folds) + " |",
                "|---|" + "---|" * len(folds)]
        out += [f"| {name} | " + " | ".join(values.get(fold, "") for fold in folds) + " |"
                for name, values in by_fold.items()]
        out.append("")
    out += ["| setting | value |", "|---|---|"]
    out += [f"| {name} | {value} |" for name, value in card["settings"].items()]
    for fold, changes in card["recipe_changes"].items():
        out.append(f"- Fold {fold}'s recipe changed on a resume (--change-recipe): " + "; ".join(
            f"{entry.get('field')} {entry.get('from')!r} -> {entry.get('to')!r} from epoch {entry.get('epoch')}"
            for entry in changes) + ".")
    out += ["", "## Software", "", ", ".join(f"{name} {version}" for name, version in card["software"].items()), "",
            "## Scores (Gy, lower is better)", "", "| what | dose score | DVH score | patients |", "|---|---|---|---|"]
    oof = card["scores"]["out_of_fold"]
    out.append(f"| out-of-fold (every training patient, by the fold that never saw it) | {oof['dose_score']:.3f} | "
               f"{oof['dvh_score']:.3f} | {len(card['patients']['training'])} |")
    out += [f"| fold {fold['fold']} on its held-out patients (epoch {fold['epoch']}) | "
            f"{fold['scores']['dose_score']:.3f} | {fold['scores']['dvh_score']:.3f} | {fold['scores']['patients']} |"
            for fold in card["scores"]["folds"]]
    deployed = card["scores"]["deployed"]
    if deployed is not None:
        out.append(f"| the folds as an ensemble, on the validation patients | {deployed['dose_score']:.3f} | "
                   f"{deployed['dvh_score']:.3f} | {deployed['patients']} |")
    commissioning = card["commissioning"]
    out += ["", "## Commissioning", "",
            f"- Dosimetric outliers (|z| > {commissioning['thresholds']['z']}): "
            f"{', '.join(commissioning['dosimetric_outliers']) or 'none'}.",
            _geometric_line(commissioning["thresholds"], commissioning["geometric_outliers"]),
            "- The report: report.html beside this card."]
    out += ["", "## Checkpoints", "", "| fold | epoch | file | SHA-256 |", "|---|---|---|---|"]
    out += [f"| {c['fold']} | {c['epoch']} | {c['path']} | `{c['sha256']}` |" for c in card["checkpoints"]]
    if card[BOUND]:
        out += ["", "## Files predictions read", "",
                "A prediction with this model reads these files of commissioning/ and refuses one whose SHA-256 is "
                "not the one below (edited since).", "", "| file | SHA-256 |", "|---|---|"]
        out += [f"| {name} | `{sha}` |" for name, sha in card[BOUND].items()]
    return "\n".join(out) + "\n"


def _data_markdown(trained_on: dict | None) -> list[str]:
    """What the folds trained on, as commissioning checked it (``report["trained_on"]``)."""
    if not trained_on:
        return []
    out = ["", "## Training data", ""]
    recorded, missing = trained_on["recorded_by"], trained_on["not_recorded_by"]
    if recorded:
        they = "it" if len(recorded) == 1 else "they"
        out.append(f"- {_folds_words(recorded, 'Fold')} recorded the SHA-256 of every file of each patient {they} "
                   f"trained on (CT, structures, possible-dose mask, voxel dimensions, dose, plan files); the records "
                   f"agree with one another and with the files commissioning read.")
    if missing:
        out.append(f"- {_folds_words(missing, 'Fold')} did not record {'its' if len(missing) == 1 else 'their'} "
                   f"training data (trained before runs recorded it): what {'it' if len(missing) == 1 else 'they'} "
                   f"trained on is not known.")
    out.append("- The files of the held-out patients, as commissioning read them, are those the out-of-fold "
               "predictions were measured against: " + ("every file, by SHA-256." if trained_on["checked"] ==
                                                         "every file" else
                                                         "their plans (dose.csv) only, by SHA-256 (predictions written "
                                                         "before every file was recorded)."))
    out.append(f"- The training patients' files (of {trained_on['data']}), together: SHA-256 `{trained_on['sha256']}`.")
    elsewhere = {fold: folders for fold, folders in trained_on["splits"].items() if folders != [trained_on["data"]]}
    for fold, folders in elsewhere.items():
        out.append(f"- Fold {fold} read them from {', '.join(folders)} (the same files, by SHA-256).")
    return out


def _folds_words(numbers: list[int], word: str) -> str:
    """``Fold 2``, ``Folds 1 and 3``."""
    if len(numbers) == 1:
        return f"{word} {numbers[0]}"
    return f"{word}s {', '.join(map(str, numbers[:-1]))} and {numbers[-1]}"


def _verdict(report: dict) -> dict:
    """The card's ``verdict``: the report's (:func:`provided_code.metrics.commissioning.verdict`,
    with its tolerances) and the bands' calibration against their binomial ranges, when measured."""
    found = dict(report["verdict"])
    check = (report.get("calibration") or {}).get("range_check")
    found["bands"] = None if not check else {key: check[key] for key in ("cells", "outside", "expected")}
    return found


def _cell_words(status: str) -> str:
    """A structure-metric's verdict in the card's table: a failing one in bold."""
    words = CELL_VERDICTS[status]
    return f"**{words}**" if status == "fail" else words


def _verdict_markdown(verdict: dict) -> list[str]:
    tolerances = verdict["tolerances"]
    source = ("the default tolerances" if tolerances["source"] == "the defaults" else
              f"the tolerances of {tolerances['source']} (SHA-256 `{tolerances['sha256']}`)")
    out = ["## Verdict", "", f"**{VERDICT_HEADS[verdict['status']]}.** {verdict['words']}", "",
           f"Judged on the out-of-fold predictions by {source}: {tolerances['words']}.", "",
           "| structure | metric | tolerance | patients within | required | verdict |", "|---|---|---|---|---|---|"]
    out += [f"| {c['structure']} | {c['metric']} | {c['within_gy']:g} Gy | {c['within']} of {c['n']} | "
            f"{100 * c['fraction']:g} % | {_cell_words(c['status'])} |" for c in verdict["cells"]]
    bands = verdict.get("bands")
    if bands:
        out += ["", f"Prediction bands on the validation patients: {bands['outside']} of {bands['cells']} "
                    f"structure-metric cells outside their binomial 95 % range ({bands['expected']:.1f} expected by "
                    f"chance)."]
    return out


def _parent_markdown(parent: dict | None) -> list[str]:
    out = ["", "## Started from", ""]
    if parent is None:
        return out + ["Random weights (no --init-from)."]
    out.append(f"Every fold started from model {parent['model']} (site {parent['site']}, {parent['folder']}): its "
               f"epoch {parent['epoch']} checkpoint {parent['checkpoint']}, SHA-256 `{parent['sha256']}`.")
    out.append("")
    out.append(f"- Taken: {len(parent.get('taken', []))} layers ({', '.join(parent.get('taken', []))}).")
    not_taken = parent.get("not_taken", [])
    out.append("- Not taken (initialised as usual): " + ("; ".join(f"{entry['layer']} ({entry['why']})"
                                                                   for entry in not_taken) or "none") + ".")
    if parent["changed"] is None:
        out.append("- The parent's checkpoint is unchanged since (SHA-256).")
    elif not parent.get("checkable", True):
        out.append(f"- The parent's checkpoint cannot be checked here: {parent['changed']}. The folds do not need "
                   f"it (their weights are their own); the SHA-256 above is what it was.")
    else:
        out.append(f"- **The parent's checkpoint is not the one the folds started from**: {parent['changed']}.")
    return out


def _geometric_line(thresholds: dict, outliers: list[str]) -> str:
    """The in-distribution check's setting (its alpha) and the training patients it flags, each
    left out of the cohort: a line of the card. A report of a check before the p-value has no alpha."""
    alpha = thresholds.get("alpha")
    if alpha is None:
        return f"- Geometric outliers: {', '.join(outliers) or 'none'}."
    note = thresholds.get("geometric_note")
    return (f"- In-distribution check: flags a patient whose anatomy and CT have a conformal p-value below alpha = "
            f"{alpha:g} against the training patients' (a patient like them is flagged at most {100 * alpha:g} % of "
            f"the time)" + (f"; {note}" if note else "") + f". Training patients it flags, each against the others: "
            f"{', '.join(outliers) or 'none'}.")
