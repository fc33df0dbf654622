"""The admission of a run: what a command may train on a model's folder, decided before any data
is read. A new model, or a resume of the saved one (which settings a resume takes from the
saved run, which it may change and how a change is recorded); a new model started from a parent's
weights (``--init-from``: the parent's network for the flags not given); a fold joining the other
folds of a cross-validated model (trained alike, dealt alike, started alike); and a model folder
holding one kind of model. ``TrainConfig`` (:mod:`provided_code.config`) says what each setting is
and which group it is in (``NETWORK``, ``ARCHITECTURE``, ``RECIPE``, ``KEPT_ON_RESUME``,
``STARTED_FROM``); this module is the policy over those groups.

Importing this module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os

from provided_code.config import ConfigError, TrainConfig, _as_text
from provided_code.exclusions import excluded_patients
from provided_code.folds import SPLITS_FILE, fold_folders
from provided_code.run_folder import CONFIG_FILE, RunFolder
from provided_code.sites import Site
from provided_code.training.init_from import parent_label, resolve_parent

logger = logging.getLogger(__name__)


def admit(config: TrainConfig, folder: RunFolder, given: set[str] | None,
              change_recipe: bool) -> tuple[TrainConfig, TrainConfig | None, list]:
    """``(config, saved, changes)``: the settings to train with (on a resume, the saved ones
    where ``given`` does not say otherwise), the saved config of the model (None for a new one),
    and the recipe changes a resume makes (:func:`resume`)."""
    saved = folder.read_config()
    changes = []
    if saved is not None:
        config, changes = resume(config, saved, given, change_recipe)
        warn_schedule_change(config, saved)
    elif folder.checkpoints():
        raise ConfigError(f"{folder.models} holds checkpoints but no {CONFIG_FILE}: the flags cannot say what "
                          f"those checkpoints are. Restore {CONFIG_FILE}, or pass --start-over to train anew.")
    else:
        if change_recipe:
            logger.warning("--change-recipe changes nothing: model %r in %s is new, and trains with the recipe "
                           "given", config.model_name, config.run_dir)
        if config.init_from:
            config = started_from(config, given)
    check_kind_of_model(config)
    if config.folds:
        check_other_folds(config, change_recipe)
    if config.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'provided_code[tensorboard]' "
                          "(or pip install tensorboard)")
    for concern in config.concerns():
        logger.warning("%s", concern)
    return config, saved, changes


def check_kind_of_model(config: TrainConfig) -> None:
    """A model's folder holds one model: a single run (its ``models/``) or a cross-validated one
    (its ``splits.json`` and ``fold-<K>/``), never both (prediction, commissioning and the node
    would take one for the other)."""
    single = RunFolder(config.model_dir)
    if config.folds and single.config_file.is_file():
        raise ConfigError(f"Cannot train fold {config.fold} of model {config.model_name!r} in {config.model_dir}: a "
                          f"single run was trained there ({single.config_file}). Choose a new --model-name for the "
                          f"cross-validated model.")
    if not config.folds and (config.model_dir / SPLITS_FILE).is_file():
        raise ConfigError(f"Cannot train model {config.model_name!r} as a single run: {config.model_dir} holds a "
                          f"cross-validated model (its {SPLITS_FILE} and fold folders). Pass --folds N --fold K to "
                          f"train one of its folds, or choose a new --model-name.")


def started_from(config: TrainConfig, given: set[str] | None) -> TrainConfig:
    """A new model with ``--init-from``: the parent resolved and recorded in ``config.parent`` (its
    checkpoint's SHA-256; the weights are taken when the model is made), and the parent's network
    wherever ``given`` does not say otherwise (:func:`with_parents_network`)."""
    record, parent = resolve_parent(config.init_from, config.init_epoch,
                                    chosen=given is None or "init_epoch" in given)
    config, inherited = with_parents_network(config, parent, given)
    if inherited:
        logger.info("Network of the %s, for the flags not given: %s", parent_label(record), ", ".join(
            f"{name} {config.site.name if name == 'site' else getattr(config, name)!r}" for name in inherited))
    if given is not None and "learning_rate" not in given:  # the rate is the recipe's, never the parent's
        logger.warning("Fine-tuning at the default learning rate %g, a training-from-scratch rate that no "
                       "fine-tuning comparison measured; docs/finetune.md's is --preset finetune (1e-4 after a "
                       "2-epoch warm-up), or give --learning-rate", config.learning_rate)
    return dataclasses.replace(config, parent=record)


_PARENT_IDENTITY = ("folder", "epoch", "checkpoint", "sha256")


def _same_parent(one: dict, other: dict) -> bool:
    return all(one.get(key) == other.get(key) for key in _PARENT_IDENTITY)


def _parent_text(record: dict) -> str:
    return (f"{record['model']!r} epoch {record['epoch']}, {record['checkpoint']}, SHA-256 {record['sha256'][:12]}…"
            if record else "random weights")


DEALT_BY = ("folds", "seed")  # the settings a model's patients are dealt into folds by (provided_code.folds)


def check_other_folds(config: TrainConfig, change_recipe: bool) -> None:
    """The folds of one model are one model's: a fold whose network differs from another fold's is
    refused, naming the settings; one whose recipe or exclusion list is not the other folds' is
    refused, naming the fold and both, unless ``change_recipe``; one whose parent (``--init-from``:
    its checkpoint, by SHA-256) is not the other folds' is refused, naming both."""
    for fold, path in fold_folders(config.model_dir).items():
        other = RunFolder(path).read_config() if fold != config.fold else None
        if other is None:
            continue
        if not _same_parent(other.parent, config.parent):
            raise ConfigError(f"Cannot train fold {config.fold} of model {config.model_name!r} from another start "
                              f"than fold {fold}'s (fold {fold}: {_parent_text(other.parent)}; here: "
                              f"{_parent_text(config.parent)}): every fold of a model starts alike. Pass fold "
                              f"{fold}'s --init-from and --init-epoch while that file is unchanged, or train the "
                              f"folds again from one start (an --init-epoch N the parent keeps).")
        # --folds and --seed deal the patients (splits.json): no --change-recipe changes them
        fixed = [name for name in (*TrainConfig.NETWORK, *DEALT_BY) if name not in TrainConfig.FROM_DATA]
        recipe = [name for name in TrainConfig.RECIPE if name not in ("excluded", *DEALT_BY)] if not change_recipe \
            else []
        differing = config.differing_from(other, (*fixed, *recipe))
        if differing:
            changeable = all(name in recipe for name in differing)  # a network change it cannot make: not offered
            raise ConfigError(f"Cannot train fold {config.fold} of model {config.model_name!r} with other settings "
                              f"than fold {fold}'s (" + "; ".join(
                                  f"{name}: fold {fold} {other.shown(name)}, requested {config.shown(name)}"
                                  for name in differing)
                              + f"): the folds of a model are trained alike. Pass fold {fold}'s settings"
                              + (" (a recipe change: --change-recipe)" if changeable else "")
                              + ", or choose a new --model-name.")
        if excluded_patients(other.excluded) != excluded_patients(config.excluded):
            said = other.shown("excluded")
            if not change_recipe:
                raise ConfigError(f"Cannot train fold {config.fold} of model {config.model_name!r} with another "
                                  f"exclusion list than fold {fold}'s (excluded there: {said}; here: "
                                  f"{config.shown('excluded')}): every fold of a "
                                  f"model leaves the same patients out. Pass --exclude "
                                  f"{other.excluded_by.get('file', 'FILE')}, or --change-recipe to train it so.")
            logger.warning("Fold %d leaves other patients out than fold %d (there: %s) (--change-recipe)",
                           config.fold, fold, said)


# -- a resume of the saved run, and a parent's network ------------------------------------------
def resume(config, saved: "TrainConfig", given: set[str] | None = None,
           change_recipe: bool = False) -> tuple["TrainConfig", list[tuple[str, object, object]]]:
    """``(config, changes)``: the settings a resume of ``saved`` trains with, and the recipe
    changes it makes, ``(field, saved value, new value)``.

    ``given``: the fields the caller set on purpose (the command line's explicit flags, a
    ``--preset``'s fields); None: every field (a library caller's config says what it wants).
    A field in ``ARCHITECTURE``, ``RECIPE`` or ``KEPT_ON_RESUME`` that is not given takes the
    saved value. Raises :class:`ConfigError` for a given architecture field (or precision) that
    differs, an ``ema`` toggle, a given ``init_from`` other than the parent the run started from
    (a resume continues from the run's own checkpoints; the same command again is a resume), and, without ``change_recipe``, a given recipe field that differs, naming each
    field's saved and requested value. The result keeps the saved ``history`` and where the
    weights started (``STARTED_FROM``).
    """
    given = {field.name for field in dataclasses.fields(TrainConfig)} if given is None else set(given)
    if given & {"beams", "beam_angles"}:  # one setting: the angles, or their number
        given |= {"beams", "beam_angles"}
    given -= set(TrainConfig.FROM_DATA)  # the model's, whatever the caller's config says: the data set them
    if config.init_from and "init_from" in given and not _same_start(config, saved):
        started = (f"it started from {saved.parent.get('model', saved.init_from)!r} (epoch "
                   f"{saved.parent.get('epoch', saved.init_epoch)})" if saved.init_from else
                   "it started from random weights")
        raise ConfigError(
            f"Cannot resume model {config.model_name!r} in {config.run_dir} with --init-from {config.init_from} "
            f"(--init-epoch {config.init_epoch}): {started}, and a resume continues from its own checkpoints (or "
            f"from that parent when it has none yet). Run the command with the parent it started from, or "
            f"without --init-from and --init-epoch, or train a new --model-name (or --start-over).")
    names = TrainConfig.ARCHITECTURE + TrainConfig.RECIPE + TrainConfig.KEPT_ON_RESUME
    resumed = dataclasses.replace(config, history=saved.history, **{
        name: getattr(saved, name) for name in TrainConfig.STARTED_FROM}, **{
        name: getattr(config if name in given else saved, name) for name in names})
    check_resume(resumed, saved)
    if resumed.ema != saved.ema:
        raise ConfigError(
            f"Cannot resume model {config.model_name!r} in {config.run_dir} with --{'' if resumed.ema else 'no-'}ema: "
            f"it was trained {'without' if resumed.ema else 'with'} weight averaging, and averaging cannot be "
            f"turned {'on' if resumed.ema else 'off'} on a resume, not even with --change-recipe (the optimizer, "
            f"the checkpoints and best.keras would disagree on which weights are the model). Drop the flag, or "
            f"train a new --model-name.")
    if saved.folds and resumed.seed != saved.seed:  # the folds' dealing: no recipe change changes it
        raise ConfigError(
            f"Cannot resume fold {saved.fold} of model {config.model_name!r} in {config.run_dir} with --seed "
            f"{resumed.seed}: the model's patients were dealt into its folds with --seed {saved.seed} (its "
            f"splits.json), which --change-recipe does not change. Drop --seed, or train a new --model-name.")
    changes = [(name, getattr(saved, name), getattr(resumed, name)) for name in TrainConfig.RECIPE
               if getattr(resumed, name) != getattr(saved, name)]
    if changes and not change_recipe:
        raise ConfigError(
            f"Cannot resume model {config.model_name!r} in {config.run_dir} with another recipe ("
            + "; ".join(f"{name}: saved {_as_text(name, old)}, requested {_as_text(name, new)}"
                        for name, old, new in changes)
            + "). A resume trains with the saved recipe: drop these flags, or pass --change-recipe to change "
              "it from the resumed epoch on (recorded in config.json's history).")
    return resumed, changes

def with_parents_network(config: TrainConfig, parent: TrainConfig,
                         given: set[str] | None) -> tuple[TrainConfig, list[str]]:
    """``(config, taken)``: a new model that starts from ``parent``'s weights (``--init-from``)
    has the parent's network (its ``NETWORK`` settings, but for those its data sets,
    ``FROM_DATA``) wherever ``given`` does not say otherwise (None: the caller's
    config says everything; nothing is taken), so that every weight fits; and the names of the
    settings that took another value from the parent. A site given that is not the parent's
    keeps its own beams (the beams are the site's technique, not the network's)."""
    if given is None:
        return config, []
    given = set(given) | ({"beams", "beam_angles"} if set(given) & {"beams", "beam_angles"} else set())
    if "site" in given and not config.site.same_as(parent.site):
        given |= {"beams", "beam_angles"}
    names = [name for name in TrainConfig.NETWORK if name not in given and name not in TrainConfig.FROM_DATA]
    taken = config.differing_from(parent, names)
    return dataclasses.replace(config, **{name: getattr(parent, name) for name in names}), taken

def with_changes_recorded(config: TrainConfig, changes: list[tuple[str, object, object]],
                          first_epoch: int) -> TrainConfig:
    """``config`` with ``changes`` (see :func:`resume`) added to its ``history``, as made
    from epoch ``first_epoch`` (1-based: the first epoch trained with them)."""
    return dataclasses.replace(config, history=config.history + tuple(
        {"epoch": first_epoch, "field": name, "from": old, "to": new} for name, old, new in changes))

def recipe_changed_at(config: TrainConfig) -> int:
    """The first epoch (1-based) trained with today's recipe: 1, unless a resume changed it
    (``history``, any field)."""
    return max([int(entry.get("epoch", 1)) for entry in config.history], default=1)

def loss_changed_at(config: TrainConfig) -> int:
    """The first epoch (1-based) trained with today's loss (``loss`` and ``dvh_weight``): 1,
    unless a resume changed it (``history``). Losses before it are not comparable."""
    return max([int(entry.get("epoch", 1)) for entry in config.history
                if entry.get("field") in ("loss", "dvh_weight")], default=1)

def check_resume(config: TrainConfig, saved: TrainConfig) -> None:
    """Raise :class:`ConfigError` if resuming ``saved`` with ``config`` would change the model."""
    changed = [f"{name}: saved {saved.shown(name)}, requested {config.shown(name)}"
               + (f" ({_site_changes(saved.site, config.site)})" if name == "site" and saved.site.name == config.site.name
                  else "")
               for name in config.differing_from(saved, TrainConfig.ARCHITECTURE)]
    if config.precision != "auto" and saved.precision != config.precision:
        changed.append(f"precision: saved {saved.precision!r}, requested {config.precision!r}")
    if changed:
        raise ConfigError(
            f"Cannot resume model {config.model_name!r} in {config.run_dir}: its saved config differs ("
            + "; ".join(changed) + "). Pass the saved values, or choose a new --model-name.")


def _same_start(config: TrainConfig, saved: TrainConfig) -> bool:
    """Whether ``--init-from`` and ``--init-epoch`` name the parent ``saved`` started from (the
    same command run again, to resume: the parent is not loaded again)."""
    recorded = saved.parent.get("folder", saved.init_from) if saved.init_from else ""
    return bool(recorded) and str(config.init_epoch) == str(saved.init_epoch) and \
        os.path.realpath(config.init_from) == os.path.realpath(recorded)


def _site_changes(saved: Site, requested: Site, most: int = 3) -> str:
    """Where two versions of one site differ, field by field as the site file spells them
    (``structures[9].prescription_gy 70 -> 72``): a site file edited in place since the model was
    trained."""
    found = []

    def walk(old, new, where):
        if isinstance(old, dict) and isinstance(new, dict):
            for key in list(old) + [k for k in new if k not in old]:
                walk(old.get(key), new.get(key), f"{where}.{key}" if where else key)
        elif isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
            for k, (a, b) in enumerate(zip(old, new)):
                walk(a, b, f"{where}[{k}]")
        elif old != new:
            found.append(f"{where} {json.dumps(old)} -> {json.dumps(new)}")

    walk(saved.to_dict(), requested.to_dict(), "")
    return "the site file differs: " + "; ".join(found[:most]) + (f"; and {len(found) - most} more" if len(found) > most
                                                                   else "")


def warn_schedule_change(config: TrainConfig, saved: TrainConfig) -> None:
    """A decaying schedule spans --epochs: resuming with another --epochs bends it."""
    if "cosine" in (config.lr_schedule, saved.lr_schedule) and (
            config.epochs != saved.epochs or config.lr_schedule != saved.lr_schedule):
        logger.warning("The learning-rate schedule changes on this resume (saved: %s over %d epochs, now: %s over "
                       "%d): the rate jumps at the resumed epoch. Resume with --epochs %d --lr-schedule %s to "
                       "keep it.", saved.lr_schedule, saved.epochs, config.lr_schedule, config.epochs,
                       saved.epochs, saved.lr_schedule)
