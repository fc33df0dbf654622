"""What a model is, resolved once (:class:`ModelSpec`: its site, architecture and inputs), and what
it eats, declared once: each input's name, dtype, per-patient shape, how augmentation moves it and
how the network unpacks it (:class:`InputSpec`).

Read by the network (one ``keras.Input`` per input, :mod:`provided_code.networks.unet`), the data
path (:func:`provided_code.data.batches.take_inputs`, :mod:`provided_code.data.tf_dataset`), the
training step (:mod:`provided_code.training.step`), augmentation
(:func:`provided_code.data.tf_augment.apply_geometry`) and prediction
(:func:`provided_code.inference.predict_arrays`, its ``--tta`` mirror included). Adding an input
volume is a declaration here, an array of the same name in ``SplitArrays`` and its unpacking in
:class:`~provided_code.networks.layers.CompactInputs`.

Pure Python and numpy: importing this imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from provided_code.sites import Site

# How augmentation moves an input (data/augment.py, data/tf_augment.py):
VOLUME = "volume"  # resampled by the draws (the axial index map, then the slice shift)
STRUCTURE_BITS = "structure bits"  # resampled, and each mirror pair's bits swapped on a left-right flip
ANGLES = "angles"  # gantry degrees turned with the patient: a flip takes g to -g, a turn by r takes g to g - r
UNCHANGED = "unchanged"  # a fact of the patient that no move changes (a prescription)
MOVES = (VOLUME, STRUCTURE_BITS, ANGLES, UNCHANGED)
# The network's body (--arch): "generator", the OpenKBP 2020 starter's (networks/unet.py: strided 4³
# convolutions, none at full resolution); "resunet", a residual U-Net (networks/resunet.py); "plain",
# the residual U-Net's stem, stages and head without the residual additions (its control)
ARCHS = ("generator", "resunet", "plain")
# The dose head's last activation (--head): "relu", max(0, x) (the generator's, and the residual U-Net's
# before it could die: a ReLU whose input is negative everywhere passes no gradient back); "softplus",
# log(1 + e^x), positive with a gradient everywhere (Adam's steps are the same size however small it is);
# "leaky", linear above zero as the ReLU, a LeakyReLU's small slope below it while training (a gradient
# everywhere) and clipped at zero when predicting (networks/layers.py: DoseFloor)
HEADS = ("relu", "softplus", "leaky")
STAGES = 6  # encoder stages (levels) at 128³: 128, 64, 32, 16, 8, 4; fewer at a lower resolution


@dataclasses.dataclass(frozen=True)
class Body:
    """What a body (``ARCHS``) is where a run names no more: its stage widths (features per stage as
    multiples of ``filters``, full resolution first, ``STAGES`` of them) and its head."""

    widths: tuple[float, ...]
    head: str


BODIES = {
    "generator": Body(widths=(1, 2, 4, 8, 8, 8), head="relu"),
    "resunet": Body(widths=(1, 2, 4, 8, 8, 8), head="softplus"),
    "plain": Body(widths=(1, 2, 4, 8, 8, 8), head="softplus"),
}


def parse_widths(text) -> tuple[float, ...]:
    """``--widths`` (``"0.25,1,2,4,8,8"``, or a sequence of numbers) as ``STAGES`` positive numbers;
    ValueError in the house style otherwise."""
    items = [item.strip() for item in text.split(",")] if isinstance(text, str) else list(text)
    try:
        widths = tuple(float(item) for item in items)
    except (TypeError, ValueError):
        widths = ()
    if len(widths) != STAGES or not all(0 < width < 1e4 for width in widths):
        raise ValueError(f"Invalid `widths`. Expected {STAGES} positive numbers, the features of each stage as "
                         f"multiples of --filters from full resolution down (e.g. 0.25,1,2,4,8,8). Received: "
                         f"widths={text!r}")
    return widths


def widths_text(widths) -> str:
    """Stage widths as ``--widths`` and ``config.json`` spell them: ``0.25,1,2,4,8,8``."""
    return ",".join(f"{width:g}" for width in widths)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One model input. ``length`` None: a volume ``(R, R, R)`` per patient; else a vector of that
    length. ``default``: a vector input's value for patients whose own plan files do not give it
    (the run-wide value: the site's prescriptions, the run's gantry angles, fewer than ``length``
    of them), applied where the inputs are made (:func:`provided_code.data.batches.patient_vectors`).
    ``mirror_bits``: the ``(right, left)`` bit pairs a flip swaps (structure bits only). ``all_slots``: every slot of an angle vector must hold an angle (``--beam-channels
    each``: one channel per slot)."""

    name: str  # the keras.Input's name, the training element's key and the SplitArrays field it is read from
    dtype: str  # numpy dtype name, what the host sends
    length: int | None  # None: a volume; else a per-patient vector of this length
    moves: str  # one of MOVES
    unpacks: str  # how the network unpacks it (documentation)
    default: tuple = ()
    mirror_bits: tuple = ()
    all_slots: bool = False

    def __post_init__(self):
        if self.moves not in MOVES:
            raise ValueError(f"Invalid `moves`. Expected one of {MOVES}. Received: moves={self.moves!r}")

    def shape(self, resolution: int) -> tuple[int, ...]:
        """One patient's shape at ``resolution``³."""
        return (resolution,) * 3 if self.length is None else (self.length,)

    @property
    def is_volume(self) -> bool:
        return self.length is None


def swap_mirror_bits(masks, mirror_bits, where):
    """``masks`` (packed structure bits: a numpy array or a TensorFlow tensor) with the bits of
    each ``(right, left)`` pair of ``mirror_bits`` (a site's ``mirror_bits``) swapped: how a
    left-right flip moves ``STRUCTURE_BITS``. Written once for both, with what numpy arrays and
    integer tensors share (``&``, ``|``, ``~``, ``!=``, bitwise on integers) and ``where``
    (``np.where`` or ``tf.where``), so that augmentation on the device
    (:func:`provided_code.data.tf_augment.swap_mirror_bits`) and ``--tta``
    (:func:`provided_code.inference.mirror_left_right`) swap alike."""
    if not mirror_bits:
        return masks
    typed = np.dtype(getattr(masks.dtype, "as_numpy_dtype", masks.dtype)).type  # a tf.DType's numpy twin
    paired = 0
    for right, left in mirror_bits:
        paired |= right | left
    zero = typed(0)
    swapped = masks & ~typed(paired)
    for right, left in mirror_bits:
        swapped = (swapped | where((masks & typed(right)) != zero, typed(left), zero)
                   | where((masks & typed(left)) != zero, typed(right), zero))
    return swapped


# A patient's voxel size for the physics channel where its arrays hold none (OpenKBP's usual, mm)
NOMINAL_VOXEL_MM = (3.5, 3.5, 2.0)


def model_inputs(site: Site, *, patient_prescriptions: bool = False, beam_slots: int = 0,
                 beam_angles: tuple[float, ...] = (), all_beam_slots: bool = False,
                 physics: bool = False) -> tuple[InputSpec, ...]:
    """The inputs of a model of ``site``, in the order the network reads them.

    Always ``ct`` and ``structure_masks`` (the site's packing). ``patient_prescriptions``: each
    patient's prescriptions ``(len(site.targets),)`` Gy, the site's for patients without their own.
    ``beam_slots`` > 0: each patient's gantry angles ``(beam_slots,)`` (NaN: an unused slot),
    ``beam_angles`` (the run-wide angles) for patients without their own; 0: the angles are the
    run's, in the network itself (no input). ``all_beam_slots``: one channel per slot, so every
    patient must fill every slot. ``physics``: each patient's ``voxel_dimensions`` (mm of the 128³
    grid), what the physics channel measures depths and margins in.
    """
    inputs = [
        InputSpec("ct", "uint16", None, VOLUME, "grey values / CT_MAX, one channel"),
        InputSpec("structure_masks", site.mask_dtype.name, None, STRUCTURE_BITS,
                  f"bit k -> channel 1 + k, one per structure of site {site.name} ({len(site.names)})",
                  mirror_bits=site.mirror_bits),
    ]
    if patient_prescriptions:
        inputs.append(InputSpec("prescriptions", "float32", len(site.targets), UNCHANGED,
                                "Gy per target (site.targets order) / the site's highest: the prescription channel",
                                default=tuple(float(site.prescriptions_gy[name]) for name in site.targets)))
    if beam_slots:
        if len(beam_angles) > beam_slots:
            raise ValueError(f"Invalid `beam_angles`. Expected at most beam_slots={beam_slots} angles. "
                             f"Received: beam_angles={beam_angles!r}")
        inputs.append(InputSpec("beam_angles", "float32", beam_slots, ANGLES,
                                "gantry degrees, NaN unused: the beam channels, made per patient",
                                default=tuple(float(a) for a in beam_angles),
                                all_slots=all_beam_slots))
    if physics:
        inputs.append(InputSpec("voxel_dimensions", "float32", 3, UNCHANGED,
                                "mm per voxel of the 128³ grid: the physics channel's depths and margins",
                                default=NOMINAL_VOXEL_MM))
    return tuple(inputs)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What a model is, resolved once: its site (a :class:`~provided_code.sites.Site`), the
    network's architecture (``arch``, its body: one of ``ARCHS``) and the inputs it eats. Built at the edge, from a run's
    :class:`~provided_code.config.TrainConfig` (``config.spec``) for training and from a trained
    model's ``config.json`` when it is loaded (:meth:`provided_code.run_folder.RunFolder.load_trained_model`),
    and passed, never the config or a site name, to the network builder, the losses, the training
    step, the dataset and prediction.

    ``gantry_angles``: the run-wide beams' IEC gantry degrees, () for no beam channels.
    ``physics``: one more channel, the beams' primary fluence (:mod:`provided_code.networks.physics`),
    from the same beams (needs them) and each patient's voxel size.
    ``patient_prescriptions`` / ``beam_slots``: each patient's own prescriptions / gantry angles
    (up to ``beam_slots``) are inputs; they count only with a prescription channel / beams, and are
    stored so (``ModelSpec(..., patient_prescriptions=True, prescription_channel=False)`` has none).
    ``widths``: the features of each encoder stage (and of the decoder stage at its resolution)
    as multiples of ``filters``, full resolution first (:func:`stage_features`); () for the body's own
    (``BODIES``). ``head``: the dose head's last activation (``HEADS``); "" for the body's own.
    ``inputs`` is derived (:func:`model_inputs`), in the order the network reads them.
    """

    site: Site
    filters: int
    resolution: int
    dropout: float
    norm: str
    prescription_channel: bool
    gantry_angles: tuple[float, ...]
    beam_channels: str
    arch: str
    physics: bool = False
    patient_prescriptions: bool = False
    beam_slots: int = 0
    widths: tuple[float, ...] = ()
    head: str = ""
    inputs: tuple[InputSpec, ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if self.arch not in ARCHS:
            raise ValueError(f"Invalid `arch`. Expected one of {ARCHS}. Received: arch={self.arch!r}")
        if not isinstance(self.site, Site):
            raise TypeError(f"Invalid `site`. Expected a resolved Site (provided_code.sites.load_site at the "
                            f"edge). Received: site={self.site!r:.60}")
        angles = tuple(float(angle) for angle in self.gantry_angles)
        object.__setattr__(self, "gantry_angles", angles)
        object.__setattr__(self, "patient_prescriptions", bool(self.prescription_channel and self.patient_prescriptions))
        object.__setattr__(self, "beam_slots", int(self.beam_slots) if angles else 0)
        if self.physics and not angles:
            raise ValueError("Invalid `physics`. Expected beams to make the physics channel of (gantry_angles). "
                             "Received: physics=True with no beams")
        body = BODIES[self.arch]
        object.__setattr__(self, "widths", parse_widths(self.widths) if self.widths else body.widths)
        object.__setattr__(self, "head", self.head or body.head)
        if self.head not in HEADS:
            raise ValueError(f"Invalid `head`. Expected one of {HEADS}. Received: head={self.head!r}")
        object.__setattr__(self, "inputs", model_inputs(
            self.site, patient_prescriptions=self.patient_prescriptions, beam_slots=self.beam_slots,
            beam_angles=angles, all_beam_slots=self.beam_channels == "each", physics=bool(self.physics)))

    def stage_features(self, stage: int) -> int:
        """The features of encoder stage ``stage`` (0: full resolution): ``filters × widths[stage]``,
        rounded, at least 1."""
        return max(1, round(self.filters * self.widths[stage]))

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def beam_angles_text(self) -> str:
        """The run-wide gantry angles as a message shows them: ``0,40,80``."""
        return ",".join(f"{angle:g}" for angle in self.gantry_angles)

    def inputs_left_out(self) -> dict[str, str]:
        """The per-patient inputs (``prescriptions``, ``beam_angles``) this model does not take, each
        with why: a patient's ``prescriptions.csv`` or ``beams.csv`` then changes nothing
        (:func:`provided_code.data.batches.plan_files_not_taken` says so)."""
        left_out = {}
        if not self.patient_prescriptions:
            left_out["prescriptions"] = ("it has no prescription channel (--no-prescription-channel)"
                                         if not self.prescription_channel else
                                         "it was trained with the site's prescriptions for every patient")
        if not self.beam_slots:
            left_out["beam_angles"] = ("it has no beam channels (--beams 0)" if not self.gantry_angles else
                                       f"it was trained with the run-wide beams (gantry {self.beam_angles_text}°)")
        return left_out
