"""A run's folder, ``results/<model-name>/``: where each of its files lives, reading and writing
them, and loading the model trained in it. The one module that knows the layout; training writes
the folder, prediction and the clinic's path read it (docs/training.md, "Everything lands in
results/<model-name>/")::

    .lock                        the run lock (infra/run_lock.py): one writer, or readers
    models/config.json           the run's settings (config.TrainConfig), with its recipe history
    models/trained_on.json       a fold's training patients, each file by its SHA-256 (data/provenance.py)
    models/epoch_<N>.keras       checkpoints, the newest kept
    models/best.keras            the checkpoint of the lowest validation dose score so far, and
    models/best.json             its record: epoch and validation scores
    training_log.csv             one row per epoch (training/epoch_log.py)
    training_curves.png          drawn from the log
    tensorboard/                 with --tensorboard
    <stage>-predictions/         a stage's prediction CSVs, the submission zip, scores.json and
                                 scores.csv, replaced whole (infra/atomic.py's replace_folder)
    <stage>-plots/               with --plots
    abandoned-<time>/            what --start-over moved aside

Every file is written whole (:mod:`provided_code.infra.atomic`). Importing this module imports
neither TensorFlow nor Keras; loading a model does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import os
import re
import time
import zipfile
from pathlib import Path

from provided_code.config import ConfigError, TrainConfig
from provided_code.data_folder import STAGES
from provided_code.folds import HELD_OUT_STAGE, SPLITS_FILE, fold_of_folder
from provided_code.errors import RunLockedError, UserError
from provided_code.infra.checksum import file_checksum
from provided_code.infra.atomic import atomic_path, folder_temporaries, remove_temporaries, write_text_atomic
from provided_code.infra.run_lock import RunLock
from provided_code.model_spec import ModelSpec
from provided_code.sites import Site, load_site

logger = logging.getLogger(__name__)

MODELS_FOLDER = "models"
CONFIG_FILE = "config.json"  # in models/
TRAINED_ON_FILE = "trained_on.json"  # in models/: what a fold trained on (provided_code.data.provenance)
BEST_FILE = "best.keras"  # in models/
BEST_RECORD = "best.json"  # in models/: {"epoch": N, "val_dose_score": Gy, "val_dvh_score": Gy}
LOG_FILE = "training_log.csv"
CURVES_FILE = "training_curves.png"
LOCK_FILE = ".lock"
TENSORBOARD_FOLDER = "tensorboard"
SCORES_FILE = "scores.json"  # in <stage>-predictions/, with scores.csv beside it
_CHECKPOINT = re.compile(r"^epoch_(\d+)\.keras$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint (or the best checkpoint's record) that was asked for does not load."""


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A trained model as loaded from its run folder (:meth:`RunFolder.load_trained_model`): what
    it is (``spec``, resolved once from ``config.json``), the settings it was trained with, the
    checkpoint's epoch and the Keras model. Whoever holds one asks it, not ``config.json`` again."""

    folder: "RunFolder"
    config: TrainConfig
    spec: ModelSpec
    epoch: int
    model: object  # a keras.Model (this module does not import Keras)

    @property
    def name(self) -> str:
        return self.folder.name


class RunFolder:
    """``results/<model-name>/`` of one model (see the module docstring)."""

    def __init__(self, path: os.PathLike | str):
        self.path = Path(path)
        # the model's name (--model-name); a fold's run folder, <model>/fold-<K>, is called <model>-fold-<K>
        self.name = (f"{self.path.parent.name}-{self.path.name}" if fold_of_folder(self.path) is not None
                     else self.path.name)
        self.models = self.path / MODELS_FOLDER
        self.config_file = self.models / CONFIG_FILE
        self.trained_on = self.models / TRAINED_ON_FILE
        self.best_checkpoint = self.models / BEST_FILE
        self.best_record = self.models / BEST_RECORD
        self.log = self.path / LOG_FILE
        self.curves = self.path / CURVES_FILE
        self.tensorboard = self.path / TENSORBOARD_FOLDER
        self.lock_file = self.path / LOCK_FILE

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def checkpoint(self, epoch: int) -> Path:
        return self.models / f"epoch_{epoch}.keras"

    def predictions(self, stage: str) -> Path:
        """``<stage>-predictions/``: the stage's prediction CSVs, and beside them in the same folder
        the submission zip and (with reference doses) ``scores.json`` and ``scores.csv``. It is
        filled as a hidden folder beside it and moved into place whole."""
        return self.path / f"{stage}-predictions"

    def plots(self, stage: str) -> Path:
        return self.path / f"{stage}-plots"

    def submission_name(self, stage: str, epoch: int | None) -> str:
        """The submission zip's name: ``<model>_<stage>_epoch_<N>.zip``, or ``..._ensemble.zip`` for
        several models averaged (``epoch`` None: :attr:`DeployedModel.epoch <provided_code.deployed_model.DeployedModel.epoch>`)."""
        return (f"{self.name}_{stage}_ensemble.zip" if epoch is None else
                f"{self.name}_{stage}_epoch_{epoch}.zip")

    def remove_if_unused(self) -> bool:
        """Remove the folder if it holds nothing but its lock file, and no process holds that lock
        (a command refused before it wrote anything made it); True if removed."""
        if not self.path.is_dir() or any(path != self.lock_file for path in self.path.iterdir()):
            return False
        try:
            with self.lock("removing the folder it made"):
                self.lock_file.unlink(missing_ok=True)
        except RunLockedError:
            return False
        try:
            self.path.rmdir()
        except OSError:  # written meanwhile
            return False
        return True

    def lock(self, what: str, shared: bool = False, advice: str | None = None) -> RunLock:
        """The folder's lock (see :class:`~provided_code.infra.run_lock.RunLock`): ``what`` the holder
        does, for a refusal's message; ``shared`` for a process that only reads the folder;
        ``advice``: what a refused process should do (default: the lock's, for a training run)."""
        return RunLock(self.lock_file, what, shared=shared, advice=advice)

    # -- the settings ----------------------------------------------------------------------------
    def read_config(self) -> TrainConfig | None:
        """The config saved in ``models/config.json`` (None if there is none); a one-line
        :class:`ConfigError` naming the file if it is not a config. Fields it holds that this
        version does not know (a newer version wrote it, or a hand edit) are named in a warning and
        left out."""
        path = self.config_file
        if not path.is_file():
            return None
        try:
            config, unknown = TrainConfig.parse_saved(path.read_text())
        except (ValueError, TypeError) as error:
            raise ConfigError(f"Invalid saved config {path}: {error}") from None
        if unknown:
            logger.warning("%s has settings this version does not know, left out: %s", path, ", ".join(unknown))
        return config

    def write_config(self, config: TrainConfig) -> None:
        write_text_atomic(self.config_file, config.to_json() + "\n")

    def spec(self, requested_site: Site | str | None = None) -> ModelSpec:
        """What the model trained here is (:class:`~provided_code.model_spec.ModelSpec`), from its
        ``config.json`` (a config without a site: OpenKBP, as every model before sites), for a
        check before the model is loaded (:meth:`load_trained_model` returns it with the model).
        ``requested_site`` (``--site``), when given, must be the model's site: see
        :func:`check_site`. Without a config, the model's missing (:meth:`missing_model`)."""
        saved = self.read_config()
        if saved is None:
            raise self.missing_model()
        check_site(saved.spec, requested_site, self.config_file)
        return saved.spec

    @property
    def is_fold(self) -> bool:
        """Whether this is a fold of a cross-validated model (``<model>/fold-<K>``, beside its dealing)."""
        return fold_of_folder(self.path) is not None and (self.path.parent / SPLITS_FILE).is_file()

    def epoch_to_apply(self, epoch: int | str | None = None) -> int | str | None:
        """The checkpoint a prediction uses: ``epoch`` if given, else ``"best"`` when the run has a
        best checkpoint, else None (the newest). A fold's model is its final checkpoint (None): its
        best was picked on its own held-out patients, so their out-of-fold predictions, which the
        commissioning and the bands are made of, must not come from it (as nnU-Net deploys each fold's
        final checkpoint). Raises if no model was trained here."""
        if not self.config_file.is_file():
            raise self.not_trained()
        if epoch is None:
            return "best" if self.best_checkpoint.is_file() and not self.is_fold else None
        return epoch

    def not_trained(self) -> FileNotFoundError:
        """The error for a folder named by its path (``--model-dir``) that holds no trained model."""
        return FileNotFoundError(f"{self.path} is not a trained model's folder: {self.config_file} is missing")

    def missing_model(self) -> FileNotFoundError:
        """The error for a model that was never trained here (a cross-validated model's folder:
        what to ask of it instead)."""
        if (self.path / SPLITS_FILE).is_file():
            return FileNotFoundError(f"{self.path} is a cross-validated model: its folds are its models. Predict "
                                     f"with them together (--predict-only --ensemble {self.name} --model-name "
                                     f"{self.name}), or with one (--folds N --fold K).")
        return FileNotFoundError(f"No trained model {self.name!r}: {self.models} has no {CONFIG_FILE}. "
                                 f"Train it first, or pass the --model-name and --results-dir it was trained with.")

    # -- checkpoints -----------------------------------------------------------------------------
    def checkpoints(self) -> list[tuple[int, Path]]:
        """``(epoch, path)`` of every checkpoint, newest first."""
        if not self.models.is_dir():
            return []
        found = [(int(m.group(1)), self.models / name) for name in os.listdir(self.models)
                 if (m := _CHECKPOINT.match(name))]
        return sorted(found, reverse=True)

    def newest_checkpoint(self) -> Path | None:
        checkpoints = self.checkpoints()
        return checkpoints[0][1] if checkpoints else None

    def remove_unfinished_checkpoints(self) -> None:
        """Remove what a process killed while saving a checkpoint left (its temporary files)."""
        remove_temporaries(self.models, "epoch_*.keras")

    def load_newest(self, compile: bool = True):
        """``(epoch, model)`` of the newest checkpoint that loads, or None when there is none.

        A checkpoint that fails to load (truncated, corrupt) is reported and the previous one tried;
        a :class:`CheckpointError` if none loads (a Keras upgrade could do that to a long run: never
        start over without being asked).
        """
        failures = []
        checkpoints = self.checkpoints()
        for epoch, path in checkpoints:
            try:
                return epoch, _load(path, compile)
            except Exception as error:  # noqa: BLE001 - any failure means "this file is unusable"
                reason = _reason(path, error)
                logger.warning("Checkpoint %s does not load (%s); trying the previous one", path, reason)
                failures.append(f"{path.name} ({reason[:200]})")
        if checkpoints:
            raise CheckpointError(f"No checkpoint in {self.models} loads: {'; '.join(failures)}. To train this model "
                                  f"from scratch, pass --start-over (the old files are moved aside, not deleted).")
        return None

    def checkpoint_file(self, epoch: int | str | None) -> tuple[int, Path]:
        """``(epoch, path)`` of the checkpoint ``epoch`` names: an epoch's, ``"best"``
        (``best.keras``, its epoch from its record) or None (the newest); a FileNotFoundError saying
        which is missing (the one home of what an epoch names, before anything is loaded)."""
        if epoch == "best":
            record = self.read_best()
            if record is None:  # read_best says None when best.keras is missing too
                raise self._no_best()
            return record["epoch"], self.best_checkpoint
        checkpoints = self.checkpoints()
        if epoch is None:
            if not checkpoints:
                raise FileNotFoundError(f"No checkpoint of model {self.name!r} in {self.models}.")
            return checkpoints[0]
        path = next((path for found, path in checkpoints if found == epoch), None)
        if path is None:
            raise FileNotFoundError(f"No checkpoint for epoch {epoch} in {self.models} "
                                    f"(have: {[found for found, _ in checkpoints]})")
        return int(epoch), path

    def load_checkpoint(self, epoch: int, compile: bool = True):
        """The model of checkpoint ``epoch``; a FileNotFoundError if there is none, a
        :class:`CheckpointError` if it does not load."""
        _, path = self.checkpoint_file(epoch)
        try:
            return _load(path, compile)
        except Exception as error:  # noqa: BLE001 - any failure means "this file is unusable"
            raise CheckpointError(f"Checkpoint {path} does not load: {_reason(path, error)}") from error

    # -- the best checkpoint ---------------------------------------------------------------------
    def read_best(self) -> dict | None:
        """The record of ``best.keras`` (epoch and validation scores), or None if there is none."""
        path = self.best_record
        if not path.is_file():
            return None
        if not self.best_checkpoint.is_file():
            logger.warning("Ignoring %s: %s beside it is missing", path, BEST_FILE)
            return None
        try:
            record = json.loads(path.read_text())
            return {"epoch": int(record["epoch"]), "val_dose_score": float(record["val_dose_score"]),
                    "val_dvh_score": float(record["val_dvh_score"])}
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointError(f"Invalid best-checkpoint record {path}: {type(error).__name__}: {error}. "
                                  f"Delete it (and {BEST_FILE} beside it) to start the best-so-far afresh.") from None

    def save_best(self, model, record: dict) -> Path:
        """Write ``best.keras`` and then its record, each atomically (the record is moved into place
        right after the model, so the two describe the same epoch)."""
        with atomic_path(self.best_record) as record_tmp:
            record_tmp.write_text(json.dumps(record, indent=2) + "\n")
            with atomic_path(self.best_checkpoint, suffix=".keras") as tmp:
                model.save(tmp)
        return self.best_checkpoint

    def remove_unfinished_best(self) -> None:
        """Remove what a process killed while saving ``best.keras`` left (its temporary files)."""
        remove_temporaries(self.models, BEST_FILE)
        remove_temporaries(self.models, BEST_RECORD)

    def load_best(self) -> tuple[int, object]:
        """``(epoch, model)`` of ``best.keras``; a clear error if there is none or it does not load."""
        record = self.read_best()
        path = self.best_checkpoint
        if record is None:  # read_best says None when best.keras is missing too
            raise self._no_best()
        try:
            return record["epoch"], _load(path, compile=False)
        except Exception as error:  # noqa: BLE001 - any failure means "this file is unusable"
            raise CheckpointError(f"Checkpoint {path} does not load: {_reason(path, error)}") from error

    def _no_best(self) -> FileNotFoundError:
        return FileNotFoundError(f"No best checkpoint in {self.models} ({BEST_FILE} and {BEST_RECORD}): it is "
                                 f"written when validation patients with doses are scored during training "
                                 f"(--score-every).")

    def checkpoint_record(self, epoch: int | str) -> dict:
        """A record of one checkpoint of this folder that finds it changed later
        (:func:`checkpoint_change`): the model's name, the folder (absolute), the epoch (``"best"``:
        ``best.keras``'s, from its record), the file's path in the folder and its SHA-256. The
        caller checked that the checkpoint is there."""
        path = self.best_checkpoint if epoch == "best" else self.checkpoint(int(epoch))
        if epoch == "best":
            epoch = self.read_best()["epoch"]
        return {"model": self.name, "folder": str(self.path.resolve()), "epoch": int(epoch),
                "checkpoint": path.relative_to(self.path).as_posix(), "sha256": file_checksum(path)}

    # -- the trained model -----------------------------------------------------------------------
    def load_trained_model(self, epoch: int | str | None = None) -> TrainedModel:
        """The model trained here (:class:`TrainedModel`: its spec, saved config, epoch and Keras
        model), under the dtype policy it was trained with. ``epoch``: a checkpoint's epoch, ``"best"`` or None for the newest. A model
        trained with ``--ema`` predicts with its averaged weights (``best.keras`` holds them; an
        epoch checkpoint holds the raw ones and the optimizer's averages)."""
        import keras

        from provided_code.inference import use_averaged_weights

        saved = self.read_config()
        if saved is None:
            raise self.missing_model()
        keras.mixed_precision.set_global_policy(saved.precision if saved.precision != "auto" else "float32")
        if epoch == "best":
            epoch, model = self.load_best()
        else:
            if epoch is None:
                loaded = self.load_newest(compile=saved.ema)
                if loaded is None:
                    raise FileNotFoundError(f"No checkpoint of model {self.name!r} loads from {self.models}.")
                epoch, model = loaded
            else:
                model = self.load_checkpoint(epoch, compile=saved.ema)
            if saved.ema:
                use_averaged_weights(model)
        return TrainedModel(self, saved, saved.spec, epoch, model)

    # -- moving aside and tidying ----------------------------------------------------------------
    def start_over(self) -> Path | None:
        """Move the model's files (checkpoints, config, best checkpoint, log, curves) and the earlier
        model's predictions, scores, zips and plots into ``abandoned-<time>/``; return that folder
        (None: there was nothing to move)."""
        names = [path for _, path in self.checkpoints()]
        names += [self.config_file, self.trained_on, self.best_checkpoint, self.best_record, self.log, self.curves]
        for stage in (*STAGES, HELD_OUT_STAGE):
            names += [self.predictions(stage), self.plots(stage), *self._earlier_scores(stage)]
            names += folder_temporaries(self.predictions(stage))
        names.append(self.path / "submissions")
        present = [path for path in names if path.exists()]
        if not present:
            return None
        folder = self.path / time.strftime("abandoned-%Y%m%d-%H%M%S")
        folder.mkdir(parents=True, exist_ok=True)
        for path in present:
            os.replace(path, folder / path.name)
        return folder

    def remove_earlier_layout(self, stage: str) -> list[Path]:
        """The scores and zips that earlier versions wrote beside ``<stage>-predictions/``
        (``<stage>-scores.json``, ``<stage>-scores.csv``, ``submissions/<model>_<stage>_*.zip``)
        describe the predictions just replaced: removed; return them."""
        submissions = self.path / "submissions"
        earlier = [*self._earlier_scores(stage),
                   *sorted(submissions.glob(f"{glob.escape(self.name)}_{stage}_*.zip"))]
        removed = [path for path in earlier if path.is_file()]
        for path in removed:
            path.unlink()
        if removed:
            with contextlib.suppress(OSError):
                submissions.rmdir()  # when empty
        return removed

    def _earlier_scores(self, stage: str) -> list[Path]:
        return [self.path / f"{stage}-scores.json", self.path / f"{stage}-scores.csv"]


def recorded_checkpoint(record: dict) -> Path:
    """The file a :meth:`RunFolder.checkpoint_record` names."""
    return Path(record["folder"]) / record["checkpoint"]


def checkpoint_change(record: dict) -> str | None:
    """None when the file a :meth:`RunFolder.checkpoint_record` names is still the one recorded
    (its SHA-256); else how it changed, for a message: gone, or its SHA-256 now."""
    path = recorded_checkpoint(record)
    if not path.is_file():
        return f"{path} is gone (recorded SHA-256 {record['sha256'][:12]}…)"
    now = file_checksum(path)
    return None if now == record["sha256"] else (f"{path} changed since it was recorded (SHA-256 "
                                                 f"{record['sha256'][:12]}…, now {now[:12]}…)")


def check_site(spec: ModelSpec, requested: Site | str | None, source) -> None:
    """A ``--site`` given with a trained model (``requested``: a site name, file or Site; None: not
    given) must be the model's own (``spec.site``, read from ``source``): another is a one-line
    :class:`ConfigError` naming both."""
    if requested is not None and not load_site(requested).same_as(spec.site):
        raise ConfigError(f"Invalid `site`. Expected the model's own site, {spec.site.name} ({source}), or no "
                          f"--site. Received: site={str(requested)!r}")


def read_scores(path: os.PathLike | str, needed: tuple[str, ...] = ()) -> dict:
    """A ``scores.json`` a stage's predictions hold (their scores, model, and epoch or members:
    :func:`provided_code.deployed_model.recorded_members`); a
    :class:`CheckpointError` naming the file when it is not one (cut off, edited) or lacks a key of
    ``needed``."""
    path = Path(path)
    try:
        scores = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a scores file ({error}); predict the stage again") from None
    missing = [key for key in needed if not isinstance(scores, dict) or key not in scores]
    if not isinstance(scores, dict) or missing:
        raise CheckpointError(f"{path}: not a scores file (no {', '.join(missing) or 'object'}); predict the stage "
                              f"again")
    return scores


class _NotAKerasFile(ValueError):
    pass


def _load(path: Path, compile: bool):
    """``keras.models.load_model`` (the package's layers registered), except that a file that is
    not a zip archive (a ``.keras`` file cut off while it was written or copied, or not a checkpoint
    at all) says so: Keras calls it "File not found"."""
    import keras

    import provided_code.networks.layers  # noqa: F401  (registers the custom layers)

    if path.is_file() and not zipfile.is_zipfile(path):
        raise _NotAKerasFile(_not_a_keras_file(path))
    return keras.models.load_model(path, compile=compile)


def check_checkpoint_file(path: os.PathLike | str) -> None:
    """A :class:`CheckpointError` naming ``path`` when it is not a complete ``.keras`` file (a zip
    archive: cut off while it was written or copied, or not a checkpoint at all), as loading it
    would say, without loading it."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"Checkpoint {path} does not load: {_not_a_keras_file(path)}")


def _not_a_keras_file(path: Path) -> str:
    return f"not a complete .keras file (a zip archive): truncated or corrupt, {path.stat().st_size} bytes"


def _reason(path: Path, error: Exception) -> str:
    """The first line of why ``path`` did not load."""
    text = str(error).splitlines()[0] if str(error) else ""
    return text if isinstance(error, _NotAKerasFile) else f"{type(error).__name__}: {text}"
