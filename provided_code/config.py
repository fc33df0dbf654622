"""The one configuration of a training run, saved as JSON beside its checkpoints
(:class:`provided_code.run_folder.RunFolder` reads and writes it).

Importing this module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from pathlib import Path

from provided_code.data.augment import parse_augment
from provided_code.data.resample import RESOLUTIONS
from provided_code.beams import BEAM_CHANNELS, beam_concerns, resolve_beam_angles
from provided_code.errors import ConfigError  # noqa: F401  (raised here; importers take it from here too)
from provided_code.model_spec import ARCHS, BODIES, HEADS, ModelSpec, parse_widths, widths_text
from provided_code.sites import SHIPPED, Site, load_site

PRECISIONS = ("auto", "mixed_float16", "mixed_bfloat16", "float32")
XLA_MODES = ("auto", "on", "off")
LOSSES = ("mae", "masked-mae")
LR_SCHEDULES = ("constant", "cosine")
NORMS = ("batch", "instance")
FREEZES = ("none", "encoder")
logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainConfig:
    # -- architecture: fixed for the life of a model; a resume must match these --
    site: "str | dict | Site" = "openkbp"  # the treatment site (provided_code/sites): openkbp, prostate or a site
    #                                        file; resolved to its Site once, saved whole (its structures,
    #                                        prescriptions, names, beams) in config.json
    arch: str = "resunet"  # the network's body (model_spec.ARCHS): resunet, a residual U-Net with a full-resolution
    #                        stem and head (the default since docs/recipe.md's body comparison); generator, the 2020
    #                        starter's (no convolution at full resolution; --preset v2)
    filters: int = 64  # base filters: stage k has widths[k] × filters features
    widths: str = ""  # the features of each of the 6 stages as multiples of filters, full resolution first
    #                   ("0.25,1,2,4,8,8"); "": the body's own (model_spec.BODIES); resolved when saved
    head: str = ""  # the dose head's last activation (model_spec.HEADS): relu, softplus or leaky; "": the body's own
    resolution: int = 128  # 128, 64 or 32: train on block-averaged volumes at this size
    dropout: float = 0.0  # SpatialDropout3D rate on alternate decoder blocks (0: none; --preset v2: 0.2)
    prescription_channel: bool = True  # one more input channel: each voxel's highest PTV prescription / 70 Gy
    norm: str = "instance"  # instance: per sample and channel (no statistics cross the batch or the replicas:
    #                         the whole replica step compiles); batch: batch norm, synchronised across replicas
    beams: int | None = None  # None: the site's beam arrangement (OpenKBP: 9 beams, 40° apart, the first at
    #                           0°; arcs sampled every sites.ARC_STEP_DEGREES); N: N equidistant coplanar
    #                           beams from 0°; 0: no beam channels
    beam_angles: str = ""  # the beams' IEC gantry angles, comma list of degrees (head-first supine); given,
    #                        it sets beams; resolved to the angles (and beams to their number) when saved
    beam_channels: str = "count"  # count: one channel, the beams crossing each voxel / beams; each: one per beam
    physics: bool = False  # one more channel: the beams' primary fluence from the CT's electron density, depth,
    #                        divergence and the targets' aperture (networks/physics.py); needs beams
    patient_prescriptions: bool = False  # the prescription channel from each patient's own prescriptions
    #                                      (prescriptions.csv; a model input): set by training when its
    #                                      data has them
    beam_slots: int = 0  # > 0: the beam channels from each patient's own gantry angles (beams.csv), at most
    #                      this many per patient (a model input, turned with the patient by augmentation);
    #                      0: the run-wide angles above. Set by training when its data has them
    # -- the patients: fixed for the life of a model, like its architecture --
    folds: int = 0  # 0: no cross-validation; N >= 2: N-fold cross-validation over train-pats/ (provided_code/folds.py)
    fold: int = 0  # with folds: the fold this run trains, 1..N (its held-out patients validate it); its run folder
    #                is results/<model_name>/fold-<fold>/
    # -- where the weights start: set when the model starts, fixed for its life (a resume never gives them) --
    init_from: str = ""  # a trained model's run folder (--init-from): the new model starts from its weights
    #                      (training/init_from.py); "": from random weights
    init_epoch: "int | str" = "best"  # with init_from, the parent's checkpoint: "best" (models/best.keras) or an epoch
    parent: dict = dataclasses.field(default_factory=dict)  # set by training from init_from when the model
    #                                                         starts: the parent's model name, folder, site,
    #                                                         epoch, checkpoint file and its SHA-256, and the
    #                                                         layers taken and not taken (training/init_from.py)
    # -- optimisation --
    epochs: int = 100  # total epochs; a resumed run continues up to this number
    batch_size: int = 2  # patients per step per device; the global batch is this × replicas
    learning_rate: float = 1e-3  # Adam, beta_1 0.5, beta_2 0.999; the peak rate of a schedule (--preset v2: 2e-4)
    lr_schedule: str = "cosine"  # cosine: decay from the peak towards 0 over the epochs after warm-up; constant
    ema: bool = False  # keep a moving average of the weights over about training.ema.EMA_EPOCHS epochs; the
    #                    averaged weights are validated, scored, kept as best.keras and predicted with
    warmup_epochs: int = 0  # rise linearly to the peak over the first N epochs (set per epoch)
    freeze: str = "none"  # encoder: the encoder's weights taken from the parent stay fixed for the first
    #                       freeze_epochs epochs (their gradients zeroed: training/freeze.py); none
    freeze_epochs: int = 0  # with freeze encoder: how many epochs (>= 1)
    loss: str = "masked-mae"  # masked-mae: mean |dose - prediction| inside the possible-dose mask (what the
    #                           dose score measures); mae: over the whole volume (the 2020 starter recipe)
    dvh_weight: float = 0.0  # weight of the DVH term (losses.dvh_difference: per structure, the dose's
    #                          moments predicted against reference, Gy) added to the loss; 0: off (0.2 and 1
    #                          did not lower either score in the 64³ comparison, docs/recipe.md)
    augment: str = "flip"  # none, or a comma list of flip, rotate, shift (see data/augment.py); each draw
    #                        depends only on (seed, epoch, step)
    scale_lr: bool = False  # multiply the learning rate by the number of replicas (linear scaling)
    seed: int = 0  # weights, dropout and the per-epoch shuffle (and the dealing of --folds)
    excluded: tuple = ()  # training patients left out (--exclude FILE): each {"patient": id, "reason": text}
    excluded_by: dict = dataclasses.field(default_factory=dict)  # where the list came from: {"file": path,
    #                                                               "command": the command line that gave it}
    # -- hardware --
    precision: str = "auto"  # auto: mixed_float16 on a GPU with compute capability >= 7.0, else float32;
    #                          saved resolved, and a resume with auto keeps the saved policy
    xla: str = "auto"  # XLA-compile each replica's forward and backward: auto = on with a GPU, off on a CPU
    #                    (XLA:CPU measured 40x slower per step than TensorFlow's oneDNN kernels: docs/performance.md)
    devices: str = "1"  # "N" or "all": MirroredStrategy over N GPUs (no GPU: N logical CPU devices)
    multi_worker: bool = False  # MultiWorkerMirroredStrategy over the machines in TF_CONFIG (worker 0 is chief)
    collective_timeout: float = 600.0  # seconds a cross-worker collective may wait before the run stops
    #                                    with an error (a lost worker); must exceed a checkpoint save
    accumulate: int = 1  # average the gradients of N consecutive batches before each update
    recompute: bool = False  # recompute block activations in the backward pass instead of storing them
    memory_map: bool = False  # train from the cache file mapped into memory (data/mapped.py) rather than from
    #                           arrays read into memory; also chosen when those would not fit (the run measures)
    # -- where things go --
    model_name: str = "unet"  # results/<model_name>/
    data_dir: str = "provided-data"  # holds train-pats/ (and validation-pats/, test-pats/)
    results_dir: str = "results"
    cache_dir: str | None = None  # None: $OPENKBP_CACHE_DIR, else $XDG_CACHE_HOME/provided_code, else
    #                               ~/.cache/provided_code
    skip_incomplete: bool = False  # leave out patients with missing files instead of stopping
    # -- checkpoints and logs --
    save_every: int = 10  # write results/<model_name>/models/epoch_<N>.keras every N epochs and at the end
    keep: int = 5  # newest checkpoints kept
    tensorboard: bool = False  # also write TensorBoard events under results/<model_name>/tensorboard/
    score_every: int = 5  # every N epochs and at the last: the challenge's dose and DVH scores on the
    #                       validation patients, and models/best.keras (lowest dose score); 0: never
    # -- the run's record --
    cost: dict = dataclasses.field(default_factory=dict)  # set by training at each start: what the network
    #                                                       costs (training/cost.py: parameters, GMAC per sample,
    #                                                       memory at the batch, checkpoint bytes); never compared
    history: tuple = ()  # the recipe changes made on resumes (--change-recipe), oldest first: each
    #                      {"epoch": the first epoch trained with it, "field": name, "from": old, "to": new}

    # What a resume may change. A resume takes the saved value of every field below that the
    # command line does not give (so the bare command resumes any run, preset or not); a field it
    # gives with another value is:
    # - ARCHITECTURE (the network's shape and inputs, NETWORK, and the model's folds): refused, always;
    #   the weights would not fit (or the folds would not be one model's).
    # - RECIPE (what the updates compute, epoch by epoch: the loss, the data's augmentation and
    #   order, the rate): refused unless --change-recipe, and then applied from the resumed epoch on
    #   and recorded in ``history``, so config.json still says what the earlier epochs were trained
    #   with. ``ema`` is recipe but is never toggled (the optimizer, the checkpoints and best.keras
    #   would disagree on which weights are the model's).
    # - KEPT_ON_RESUME: changed freely. ``epochs``: resuming to more epochs is normal (a cosine
    #   schedule that bends is said in the log). ``batch_size`` and ``accumulate``: how an update is
    #   split over devices and micro-batches; a resume on other hardware sets them so that batch ×
    #   replicas × accumulate, the patients per update, stays the same.
    # - STARTED_FROM (where the weights started: --init-from, --init-epoch and the parent they
    #   resolved to): set when the model starts; a resume keeps the saved ones and refuses
    #   --init-from (it continues from the run's own checkpoints, never the parent's weights).
    # Everything else (checkpoint and scoring cadence, hardware, folders) is per command.
    # what the weights are shaped by: ModelSpec's fields (its gantry_angles are beams and beam_angles here)
    NETWORK = tuple(name for field in dataclasses.fields(ModelSpec) if field.init
                    for name in (("beams", "beam_angles") if field.name == "gantry_angles" else (field.name,)))
    ARCHITECTURE = NETWORK + ("folds", "fold")
    RECIPE = ("loss", "dvh_weight", "augment", "lr_schedule", "warmup_epochs", "learning_rate", "scale_lr", "ema",
              "seed", "excluded", "freeze", "freeze_epochs")
    KEPT_ON_RESUME = ("epochs", "batch_size", "accumulate", "excluded_by")
    FROM_DATA = ("patient_prescriptions", "beam_slots")  # architecture that training sets from its data
    STARTED_FROM = ("init_from", "init_epoch", "parent")

    def __post_init__(self):
        for name in ("filters", "epochs", "batch_size", "save_every", "keep", "accumulate"):
            self._check(name, _is_integer(getattr(self, name), 1), "an integer >= 1")
        self._check("warmup_epochs", _is_integer(self.warmup_epochs, 0), "an integer >= 0")
        self._check("score_every", _is_integer(self.score_every, 0), "an integer >= 0 (0: never)")
        self._check_choice("loss", LOSSES)
        self._check_choice("norm", NORMS)
        self._check_choice("arch", ARCHS)
        self.widths = widths_text(_parsed(parse_widths, self.widths) if self.widths else BODIES[self.arch].widths)
        self.head = self.head or BODIES[self.arch].head
        self._check_choice("head", HEADS)
        self._check("dvh_weight", _is_finite_number(self.dvh_weight) and self.dvh_weight >= 0, "a finite number >= 0")
        self.site = load_site(self.site)  # once: a Site stays itself through dataclasses.replace; a SiteError
        #                                   names the file and the field
        self._check("beams", self.beams is None or _is_integer(self.beams, 0), "an integer >= 0 (0: none), or "
                                                                                "None (the site's beams)")
        if self.beams is None and not str(self.beam_angles).strip():
            self._gantry_angles = self.site.beams.gantry_angles()
        else:
            self._gantry_angles = _parsed(resolve_beam_angles, self.beams or 0, self.beam_angles)  # parsed once, here
        self.beams, self.beam_angles = len(self._gantry_angles), ",".join(f"{a:g}" for a in self._gantry_angles)
        self._check_choice("beam_channels", BEAM_CHANNELS)
        self._check("physics", isinstance(self.physics, bool) and (not self.physics or bool(self._gantry_angles)),
                    "true or false; true only with beams (--beams or --beam-angles, or the site's)")
        self._check("patient_prescriptions", isinstance(self.patient_prescriptions, bool), "true or false")
        self._check("beam_slots", _is_integer(self.beam_slots, 0), "an integer >= 0 (0: the run-wide angles)")
        self._check_choice("lr_schedule", LR_SCHEDULES)
        self._augmentations = _parsed(parse_augment, self.augment)  # parsed once, here
        self.augment = ",".join(self._augmentations) or "none"
        self._check_choice("xla", XLA_MODES)
        self._check("collective_timeout", isinstance(self.collective_timeout, (int, float)) and self.collective_timeout > 0,
                    "a number of seconds > 0")
        self._check_choice("resolution", RESOLUTIONS)
        self._check_choice("precision", PRECISIONS)
        self._check("learning_rate", _is_finite_number(self.learning_rate) and self.learning_rate > 0,
                    "a finite number > 0")
        self._check("dropout", isinstance(self.dropout, (int, float)) and 0 <= self.dropout < 1, "a number in [0, 1)")
        self._check("devices", self.devices == "all" or (str(self.devices).isdigit() and int(self.devices) >= 1),
                    "a number >= 1 or 'all'")
        self._check("model_name", bool(self.model_name) and os.sep not in self.model_name
                    and self.model_name not in (".", ".."), "a plain folder name")
        self._check("cost", isinstance(self.cost, dict), "the network's cost (a JSON object)")
        self._check("history", isinstance(self.history, (list, tuple))
                    and all(isinstance(entry, dict) for entry in self.history), "a list of recipe changes")
        self.history = tuple(self.history)
        self._check("folds", _is_integer(self.folds, 0) and self.folds != 1, "0 (no cross-validation) or 2 or more")
        self._check("fold", _is_integer(self.fold, 0) and (1 <= self.fold <= self.folds if self.folds else
                                                            self.fold == 0),
                    f"1 to {self.folds} (--folds {self.folds})" if self.folds else "--folds with --fold")
        self._check("excluded", isinstance(self.excluded, (list, tuple)) and all(
            isinstance(entry, dict) and set(entry) == {"patient", "reason"} for entry in self.excluded),
            "a list of {\"patient\", \"reason\"}")
        self.excluded = tuple(dict(entry) for entry in self.excluded)
        self._check("excluded_by", isinstance(self.excluded_by, dict), "{\"file\", \"command\"}")
        self._check("init_from", isinstance(self.init_from, str), "a trained model's folder, or \"\" (none)")
        self._check("init_epoch", self.init_epoch == "best" or _is_integer(self.init_epoch, 1),
                    "'best' or a checkpoint's epoch (an integer >= 1)")
        self._check("init_epoch", self.init_epoch == "best" or bool(self.init_from),
                    "--init-epoch only with --init-from")
        self._check("parent", isinstance(self.parent, dict), "the parent's record (a JSON object)")
        self._check_choice("freeze", FREEZES)
        self._check("freeze_epochs", _is_integer(self.freeze_epochs, 1) if self.freeze != "none"
                    else self.freeze_epochs == 0,
                    f"an integer >= 1 with --freeze {self.freeze}" if self.freeze != "none"
                    else "0 without --freeze (--freeze encoder --freeze-epochs N)")
        self._check("freeze", self.freeze == "none" or self.norm != "batch",
                    "none with --norm batch (batch normalisation's moving statistics follow the new patients "
                    "in training whatever the gradients, so the encoder would not stay the parent's)")

    def differing_from(self, other: "TrainConfig", names) -> list[str]:
        """The fields of ``names`` whose values here are not ``other``'s (a site: by its contents)."""
        return [name for name in names if not _same(name, getattr(other, name), getattr(self, name))]

    def shown(self, name: str) -> str:
        """A field's value as a message shows it (a site by its name, an exclusion list by its patients)."""
        return _shown(self, name)

    def _check(self, name: str, valid: bool, expected: str) -> None:
        """A :class:`ConfigError` in the house style unless ``valid``: the field, what it must be, its value."""
        if not valid:
            raise ConfigError(f"Invalid `{name}`. Expected {expected}. Received: {name}={getattr(self, name)!r}")

    def _check_choice(self, name: str, choices: tuple) -> None:
        self._check(name, getattr(self, name) in choices, f"one of {choices}")

    @property
    def model_dir(self) -> Path:
        """``results/<model-name>``: the model's folder (with ``--folds``, its folds' folders and their dealing)."""
        return Path(self.results_dir) / self.model_name

    @property
    def run_dir(self) -> Path:
        """The run's folder (its layout: :mod:`provided_code.run_folder`): ``results/<model-name>``, or
        with ``--folds``, ``results/<model-name>/fold-<K>``."""
        return self.model_dir / f"fold-{self.fold}" if self.folds else self.model_dir  # folds.fold_dir, a layer up

    @functools.cached_property
    def spec(self) -> ModelSpec:
        """The model these settings describe (its architecture fields), resolved once per config."""
        return ModelSpec(**{field.name: getattr(self, field.name) for field in dataclasses.fields(ModelSpec)
                            if field.init})

    @property
    def augmentations(self) -> tuple[str, ...]:
        """``augment`` parsed: the moves in canonical order, () for none."""
        return self._augmentations

    @property
    def gantry_angles(self) -> tuple[float, ...]:
        """``beams`` and ``beam_angles`` resolved: each beam's gantry angle in degrees, () for none."""
        return self._gantry_angles

    def to_json(self) -> str:
        """The settings as ``config.json`` holds them (the site as its file says it)."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        values["site"] = self.site.to_dict()
        return json.dumps(values, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TrainConfig":
        """A saved config (see :meth:`parse_saved`), the fields this version does not know left out."""
        return cls.parse_saved(text)[0]

    @classmethod
    def parse_saved(cls, text: str) -> tuple["TrainConfig", list[str]]:
        """``(config, unknown)``: a saved config, and the names of the fields it has that this
        version does not know (left out). A setting it lacks (saved before the setting existed)
        takes the value that reproduces what that run trained (``ABSENT_MEANS``), not today's
        default. Raises ValueError or TypeError for a text that is not a config."""
        values, unknown = _known_values(json.loads(text))
        return cls(**values), unknown

    def concerns(self) -> list[str]:
        """Settings that are valid but probably not what was meant, one sentence each (a run logs
        them as warnings): a warm-up as long as the run, too many or too close beams."""
        concerns = []
        if self.warmup_epochs >= self.epochs:
            concerns.append(f"--warmup-epochs {self.warmup_epochs} with --epochs {self.epochs}: the rate rises until "
                            f"epoch {self.warmup_epochs + 1}, so the peak --learning-rate {self.learning_rate:g} is "
                            f"never reached")
        if self.beams:
            concerns += [f"--beams/--beam-angles: {concern}" for concern in
                         beam_concerns(self.gantry_angles, self.resolution)]
        if self.freeze != "none" and not (self.init_from or self.parent):
            concerns.append(f"--freeze {self.freeze} without --init-from: the {self.freeze}'s random starting weights "
                            f"stay fixed for {self.freeze_epochs} epoch(s)")
        if self.freeze != "none" and self.freeze_epochs >= self.epochs:
            concerns.append(f"--freeze-epochs {self.freeze_epochs} with --epochs {self.epochs}: the {self.freeze} "
                            f"never trains")
        return concerns


# What a saved config without the setting trained with: each setting added after the first models
# were saved, at its value before it existed.
ABSENT_MEANS = {"site": "openkbp", "arch": "generator", "widths": "1,2,4,8,8,8", "head": "relu", "dropout": 0.2, "learning_rate": 2e-4, "physics": False, "norm": "batch", "prescription_channel": False, "beams": 0, "beam_angles": "", "beam_channels": "count",
                "ema": False, "dvh_weight": 0.0}


def _same(name: str, saved, requested) -> bool:
    """Whether a saved and a requested setting agree (a site: the same file's contents)."""
    return saved.same_as(requested) if name == "site" else saved == requested


def _as_text(name: str, value) -> str:
    """A setting's value for a message: the patients of an exclusion list, else its repr."""
    if name == "excluded":
        return ", ".join(entry["patient"] for entry in value) or "none"
    return repr(value)


def _shown(config: TrainConfig, name: str) -> str:
    """A field's value for a message; a site by its name (its whole JSON would hide the line), an
    exclusion list by its patients."""
    if name == "excluded":
        return _as_text(name, config.excluded)
    if name == "site":
        site = config.site
        return repr(site.name) if site.name not in SHIPPED or site.same_as(load_site(site.name)) \
            else f"{site.name!r} (another version of it)"
    return repr(getattr(config, name))


def _is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_integer(value, least: int) -> bool:
    """``value`` is an int (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _parsed(parse, *text):
    """``parse(*text)``, its ValueError (a message in the house style) as a :class:`ConfigError`."""
    try:
        return parse(*text)
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _known_values(saved) -> tuple[dict, list[str]]:
    """``(values, unknown)``: the fields of a parsed config.json that ``TrainConfig`` knows (with
    ``ABSENT_MEANS`` for those it lacks), and the names of those it does not."""
    if not isinstance(saved, dict):
        raise ConfigError(f"expected a JSON object of settings, found {type(saved).__name__} {saved!r:.60}")
    known = {field.name for field in dataclasses.fields(TrainConfig)}
    values = {**ABSENT_MEANS, **{key: value for key, value in saved.items() if key in known}}
    if isinstance(values.get("xla"), bool):  # configs saved before --xla auto|on|off
        values["xla"] = "on" if values["xla"] else "off"
    return values, sorted(str(key) for key in saved if key not in known)


def field_defaults() -> dict:
    """``TrainConfig``'s defaults as declared, before ``__post_init__`` resolves them (``beams``
    without its angles): what the command line and the presets start from."""
    return {field.name: field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
            for field in dataclasses.fields(TrainConfig)}


def check_beam_flags(beams: int, beam_angles: str) -> None:
    """``--beams`` and ``--beam-angles`` both given on purpose: they must agree (the angles would
    otherwise win in silence)."""
    if not str(beam_angles).strip():
        return
    try:
        angles = resolve_beam_angles(beams, beam_angles)
    except ValueError:
        return  # TrainConfig names the bad list
    if beams != len(angles):
        raise ConfigError(f"Invalid `beams`. Expected the number of --beam-angles ({len(angles)}: {beam_angles!r}), "
                          f"or --beam-angles alone. Received: beams={beams}")
