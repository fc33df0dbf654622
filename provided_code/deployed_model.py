"""The model a prediction is made with (:class:`DeployedModel`): one trained run, a cross-validated
model's folds (``--folds``: they serve together, as nnU-Net deploys its folds), or several runs
named together (``--predict-only --ensemble a,b``). Its members are run folders, each at one
checkpoint known by its file's SHA-256 and with what it is (its
:class:`~provided_code.model_spec.ModelSpec`: site, body ``arch``, resolution, inputs); its one
:meth:`~DeployedModel.predict` averages their 128³ doses; :meth:`~DeployedModel.trust` reads what
its commissioning lets its predictions say (:mod:`provided_code.trust`).

What a prediction records of it (``scores.json``, ``dvh.json``): one member, its ``epoch``; several,
or any named with ``--ensemble`` (even one), their ``members`` (each ``{"model", "epoch",
"sha256"}``) and no epoch. Files written before this module held ``"epoch": "ensemble"`` beside
their members: :func:`recorded_members` reads both.

Opening a deployed model reads the members' configs and hashes their checkpoints; nothing is
loaded until :meth:`~DeployedModel.predict` or :meth:`~DeployedModel.loaded`. The members'
folders are locked meanwhile: :meth:`~DeployedModel.locked` takes their locks and opens it
(``openkbp-dicom predict``, the node); ``--predict-only`` holds its own. Importing this module
imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from provided_code.config import ConfigError
from provided_code.folds import fold_members, fold_of_folder
from provided_code.infra.checksum import file_checksum
from provided_code.infra.progress import Progress, no_progress
from provided_code.model_spec import ModelSpec
from provided_code.run_folder import RunFolder, TrainedModel, check_checkpoint_file
from provided_code.sites import Site
from provided_code.trust import Trust, load_trust, no_trust

logger = logging.getLogger(__name__)

LEGACY_ENSEMBLE_EPOCH = "ensemble"  # what files written before this module held as an ensemble's "epoch"


@dataclasses.dataclass(frozen=True)
class Member:
    """One model of a deployed model: its run folder at one checkpoint (``epoch``; ``checkpoint``:
    the file, ``best.keras`` or ``epoch_<N>.keras``; ``sha256``: the file's, when it was opened)
    and what it is (``spec``)."""

    folder: RunFolder
    epoch: int
    checkpoint: Path
    sha256: str
    spec: ModelSpec

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def fold(self) -> int | None:
        """K of a cross-validated model's ``fold-<K>``, else None."""
        return fold_of_folder(self.folder.path) if self.folder.is_fold else None

    def record(self) -> dict:
        """What a prediction records of the member: ``{"model", "epoch", "sha256"}``."""
        return {"model": self.name, "epoch": self.epoch, "sha256": self.sha256}

    def identity(self) -> dict:
        """What identifies a fold's checkpoint to its commissioning (``bands.json``'s ``folds``):
        ``{"fold", "epoch", "sha256"}``."""
        return {"fold": self.fold, "epoch": self.epoch, "sha256": self.sha256}

    def load(self) -> TrainedModel:
        """The member's Keras model, from its checkpoint (a :class:`CheckpointError` naming the file
        when it does not load)."""
        which = "best" if self.checkpoint == self.folder.best_checkpoint else self.epoch
        return self.folder.load_trained_model(which)


def open_member(folder: RunFolder, epoch: int | str | None, requested_site: Site | str | None = None) -> Member:
    """``folder`` at the checkpoint ``epoch`` names (an epoch, ``"best"``, None: the newest), its
    spec read and its checkpoint hashed. ``requested_site`` (``--site``), when given, must be the
    model's own (:meth:`RunFolder.spec`). A checkpoint that is not a complete ``.keras`` file is a
    :class:`~provided_code.run_folder.CheckpointError` naming it, here, before a caller loads any
    patient: the file hashed is the one loaded, so the newest is never passed over for an earlier."""
    spec = folder.spec(requested_site)  # the model's missing, or another site: said before the checkpoint
    resolved, path = folder.checkpoint_file(epoch)
    check_checkpoint_file(path)
    return Member(folder, resolved, path, file_checksum(path), spec)


def member_folders(model_dir: os.PathLike | str) -> list[RunFolder]:
    """The run folders a model folder stands for: itself, or a cross-validated model's folds, fold
    1 to N (a :class:`~provided_code.folds.FoldsError` names the folds missing)."""
    folds = fold_members(model_dir)
    return [RunFolder(path) for path in folds] if folds else [RunFolder(model_dir)]


@dataclasses.dataclass(frozen=True)
class DeployedModel:
    """A model as it predicts (module docstring). ``name``: what it is called (a model folder's
    name, or the names given together); ``members``: its members, in order; ``source``: the model
    folder whose commissioning may speak for it (None: several models named together, which no
    commissioning assesses); ``ensemble``: its members were named with ``--ensemble`` (its
    predictions then record them, and no epoch, even for one: :attr:`is_ensemble`)."""

    name: str
    members: tuple[Member, ...]
    source: Path | None
    ensemble: bool = False
    models: tuple[TrainedModel, ...] = dataclasses.field(default=(), repr=False, compare=False)

    def __post_init__(self):
        # refused as the option the user gave: --ensemble's names, or the model folder (--model-dir)
        option, given = ("ensemble", self.name) if self.ensemble else ("model_dir", str(self.source or self.name))
        if not self.members:
            raise ConfigError(f"Invalid `{option}`. Expected one or more trained models. Received: "
                              f"{option}={given!r} (no model)")
        first = self.members[0]
        differ = [other for other in self.members[1:] if not other.spec.site.same_as(first.spec.site)]
        if differ:
            said = ", ".join(f"{member.name!r} on {member.spec.site.name}: {member.folder.config_file}"
                             for member in (first, *differ))
            raise ConfigError(f"Invalid `{option}`. Expected models trained on one site. Received: "
                              f"{option}={given!r} ({said})")

    @classmethod
    def open(cls, model_dir: os.PathLike | str, epoch: int | str | None = None,
             requested_site: Site | str | None = None) -> "DeployedModel":
        """The model of ``model_dir``: a run folder, or a cross-validated model's folder (its folds),
        each member at :meth:`RunFolder.epoch_to_apply` of ``epoch`` (None: a run's best when it has
        one, else its newest; a fold's final checkpoint). ``requested_site``: as :func:`open_member`'s."""
        return cls._of_folders(Path(model_dir), member_folders(model_dir), epoch, requested_site)

    @classmethod
    @contextlib.contextmanager
    def locked(cls, model_dir: os.PathLike | str, holder: str, epoch: int | str | None = None,
               requested_site: Site | str | None = None) -> Iterator["DeployedModel"]:
        """:meth:`open`'s model of ``model_dir`` while its members' folders are locked shared for
        ``holder`` (a training run on one is refused meanwhile; other readers are not). A folder
        that holds no trained model is said before any lock is taken (a lock would create it)."""
        model_dir = Path(model_dir)
        folders = member_folders(model_dir)  # the folds gathered once
        for folder in folders:
            if not folder.config_file.is_file():
                raise folder.not_trained()
        with contextlib.ExitStack() as locks:
            for folder in folders:
                locks.enter_context(folder.lock(holder, shared=True))
            yield cls._of_folders(model_dir, folders, epoch, requested_site)

    @classmethod
    def _of_folders(cls, model_dir: Path, folders: list[RunFolder], epoch: int | str | None,
                    requested_site: Site | str | None) -> "DeployedModel":
        epochs = [folder.epoch_to_apply(epoch) for folder in folders]  # every member's, before any is hashed
        return cls(model_dir.name, tuple(open_member(folder, e, requested_site)
                                         for folder, e in zip(folders, epochs, strict=True)), model_dir)

    @classmethod
    def of_runs(cls, name: str, folders: Sequence[RunFolder], epochs: Sequence[int | str | None],
                requested_site: Site | str | None = None, source: os.PathLike | str | None = None,
                ensemble: bool = False) -> "DeployedModel":
        """``folders``, each at its checkpoint of ``epochs`` (as :func:`open_member` reads them),
        called ``name``; ``source``: the model folder they stand for (None: several models);
        ``ensemble``: named with ``--ensemble`` (``name``: the names given, comma-separated)."""
        return cls(name, tuple(open_member(folder, epoch, requested_site)
                               for folder, epoch in zip(folders, epochs, strict=True)),
                   Path(source) if source is not None else None, ensemble)

    # -- what it is ------------------------------------------------------------------------------
    @property
    def site(self) -> Site:
        """The members' site (one: checked at construction)."""
        return self.members[0].spec.site

    @property
    def averages(self) -> bool:
        """Whether its predictions are the mean of several members'."""
        return len(self.members) > 1

    @property
    def is_ensemble(self) -> bool:
        """Whether it is an ensemble: several members averaged, or members named with
        ``--ensemble`` (one ordinary run too): its predictions name their members, not an epoch."""
        return self.ensemble or self.averages

    @property
    def epoch(self) -> int | None:
        """The checkpoint's epoch of a single member; None for an ensemble (:attr:`is_ensemble`:
        each member has its own)."""
        return None if self.is_ensemble else self.members[0].epoch

    @property
    def folders(self) -> list[RunFolder]:
        return [member.folder for member in self.members]

    def records(self) -> list[dict]:
        """Each member as a prediction records it (:meth:`Member.record`)."""
        return [member.record() for member in self.members]

    def what(self) -> dict:
        """What a prediction's file records of the model: ``{"epoch": N}`` for one member,
        ``{"members": [...]}`` for an ensemble (:attr:`is_ensemble`; module docstring)."""
        return {"members": self.records()} if self.is_ensemble else {"epoch": self.epoch}

    # -- trust -----------------------------------------------------------------------------------
    def trust(self, coverage: float) -> Trust:
        """What its commissioning lets its predictions say at the bands' nominal ``coverage``
        (:func:`provided_code.trust.load_trust`); a model of several models named together has
        none."""
        if self.source is None:
            return no_trust(self.name, coverage, f"an ensemble of {len(self.members)} models "
                                                 f"({', '.join(member.name for member in self.members)}): no "
                                                 f"commissioning assesses it")
        return load_trust(self.source, [(member.folder, member.epoch, member.sha256, member.checkpoint)
                                        for member in self.members], coverage)

    # -- predicting ------------------------------------------------------------------------------
    def loaded(self) -> "DeployedModel":
        """This model with every member's Keras model loaded and kept (a node's, asked one patient
        at a time): :meth:`predict` then reads no file."""
        if self.models:
            return self
        return dataclasses.replace(self, models=tuple(member.load() for member in self.members))

    def predict(self, arrays, batch_size: int = 1, tta: bool = False, progress: Progress = no_progress) -> np.ndarray:
        """The 128³ doses of ``arrays``' patients (:func:`provided_code.inference.predict_full_resolution`,
        each member at its own resolution, with its own mirror flips under ``tta``), the mean of the
        members' (float32). A model not :meth:`loaded` loads each member in turn and lets it go
        after its prediction. A :class:`~provided_code.inference.PredictionError` names the member
        whose doses are not finite (its caller, which knows, adds what was written)."""
        import keras

        from provided_code.data.batches import warn_plan_files_not_taken
        from provided_code.inference import PredictionError, predict_full_resolution

        total = None
        for index, member in enumerate(self.members):
            trained = self.models[index] if self.models else member.load()
            warn_plan_files_not_taken(arrays, trained.spec.inputs_left_out(), f"Model {member.name!r}")
            try:
                doses = predict_full_resolution(trained.model, arrays, trained.spec, batch_size, tta, progress,
                                                label=f"Model {member.name!r} at epoch {member.epoch}")
            except PredictionError as error:
                raise PredictionError(f"{error}: this checkpoint is unusable (did training diverge? see "
                                      f"{member.folder.log})") from None  # the caller says what was written
            total = doses if total is None else total + doses
            if not self.models:
                del trained
                keras.backend.clear_session()
        if self.averages:
            total /= np.float32(len(self.members))
            logger.info("Averaged %s", ", ".join(f"{m.name} (epoch {m.epoch})" for m in self.members))
        return total

    @property
    def label(self) -> str:
        """The model in a few words (an RT Dose's series description, a node's journal):
        ``epoch 3``, or ``2 folds`` (``2 models``) averaged (an ensemble of one: ``1 model``)."""
        return f"{len(self.members)} {self._kind}" if self.is_ensemble else f"epoch {self.epoch}"

    def used(self) -> str:
        """The model in words, for a summary: ``the epoch 3 checkpoint``, or ``the 2 folds (cv-fold-1
        epoch 2, cv-fold-2 epoch 2) averaged`` (``the 2 models (...)``; an ensemble of one run:
        ``an ensemble of 1 model (m epoch 3)``)."""
        if not self.is_ensemble:
            return f"the epoch {self.epoch} checkpoint"
        listed = ", ".join(f"{member.name} epoch {member.epoch}" for member in self.members)
        if not self.averages:
            return f"an ensemble of 1 {self._kind} ({listed})"
        return f"the {len(self.members)} {self._kind} ({listed}) averaged"

    @property
    def _kind(self) -> str:
        kind = "fold" if all(member.fold is not None for member in self.members) else "model"
        return kind if len(self.members) == 1 else f"{kind}s"


def recorded_members(record: dict) -> list[dict]:
    """The members a prediction's record (``scores.json``, ``dvh.json``'s ``model``) names, each
    ``{"model", "epoch", ...}``: its ``members``, or its one model at its ``epoch``; files written
    before :class:`DeployedModel` (``"epoch": "ensemble"`` beside their members) read alike."""
    if "members" in record:
        return list(record["members"])
    if record.get("epoch") in (None, LEGACY_ENSEMBLE_EPOCH):
        return []
    return [{"model": record.get("model"), "epoch": record["epoch"]}]
