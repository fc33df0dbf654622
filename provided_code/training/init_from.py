"""A new model that starts from a trained model's weights (``--init-from MODEL_DIR``, ``--init-epoch
best|N``): the parent.

The parent is read through its run folder (:class:`~provided_code.run_folder.RunFolder`, the one
home of its layout); the checkpoint used is recorded in the new model's ``config.json`` (``parent``:
the parent's model name, folder, site, epoch, checkpoint file and SHA-256, and the layers taken and
not), checked by its SHA-256 before and after it is loaded, and again if the new run has to start
from it a second time (it stopped before its first checkpoint). A resume of the new model loads its
own checkpoints, never the parent.

Which weights are taken: each layer of the new model takes the parent's layer of the same name
when every one of its weights (a convolution's kernel and bias, a normalisation's scale and offset,
batch norm's moving statistics) has the same name and shape there; the other layers keep their
usual initialisation. The same model (site, inputs, network size, resolution) takes every weight;
a model whose first convolution differs only in its input channels (another site, another number
of structures or beam channels) takes everything but that layer. Taking nothing is refused. The
optimizer starts afresh (a fine-tune's rate and schedule are its own).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path
from typing import Mapping, Sequence

import keras
import numpy as np

from provided_code.config import TrainConfig
from provided_code.errors import UserError
from provided_code.folds import fold_folders
from provided_code.model_spec import ModelSpec
from provided_code.run_folder import (
    BEST_FILE,
    CONFIG_FILE,
    MODELS_FOLDER,
    RunFolder,
    checkpoint_change,
    recorded_checkpoint,
)

# A layer's weights as matched: (weight name, shape) each, in the layer's order
Shapes = Sequence[tuple[str, tuple[int, ...]]]


class InitFromError(UserError, ValueError):
    """A parent that cannot be started from, or a model that takes nothing of it: one line naming
    the parent's folder and what is wrong."""


logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Matching:
    """Which of a new model's layers (those with weights) take the parent's weights."""

    taken: tuple[str, ...]  # layers whose every weight is the parent's
    not_taken: tuple[tuple[str, str], ...]  # (layer, why) of the others: initialised as usual
    unused: tuple[str, ...]  # the parent's layers with weights that have no layer of their name here
    fingerprint: str = ""  # of the taken layers' weights, once set (take_weights): layers_fingerprint

    def describe(self, parent: str) -> list[str]:
        """What was taken and what was not, one log line each."""
        if not self.not_taken and not self.unused:
            return [f"Every weight taken from {parent}: the same network ({len(self.taken)} layers with weights)"]
        lines = [f"Taken from {parent}: {len(self.taken)} of {len(self.taken) + len(self.not_taken)} layers with "
                 f"weights: {', '.join(self.taken)}"]
        left = [f"{layer} ({why})" for layer, why in self.not_taken]
        if self.unused:
            left.append(f"the parent's {', '.join(self.unused)} (no layer of that name here)")
        lines.append(f"Not taken from {parent} (initialised as usual): {'; '.join(left)}")
        return lines


def match_layers(parent: Mapping[str, Shapes], model: Mapping[str, Shapes]) -> Matching:
    """Which layers of ``model`` take ``parent``'s weights (each: layer name -> its weights'
    ``(name, shape)``): those of the same name whose weights all have the same names and shapes."""
    taken, not_taken = [], []
    for layer, shapes in model.items():
        theirs = parent.get(layer)
        if theirs is None:
            not_taken.append((layer, "not in the parent"))
        elif _as_key(theirs) == _as_key(shapes):
            taken.append(layer)
        else:
            not_taken.append((layer, _difference(theirs, shapes)))
    return Matching(tuple(taken), tuple(not_taken), tuple(layer for layer in parent if layer not in model))


def _as_key(shapes: Shapes) -> list[tuple[str, tuple[int, ...]]]:
    return [(str(name), tuple(int(n) for n in shape)) for name, shape in shapes]


def _difference(parent: Shapes, model: Shapes) -> str:
    """Why two layers of one name do not match, as a log says it: the weights whose shapes differ."""
    theirs, ours = dict(_as_key(parent)), dict(_as_key(model))
    if set(theirs) != set(ours):
        return f"weights {', '.join(theirs)} in the parent, {', '.join(ours)} here"
    return "; ".join(f"{name} {_shape(theirs[name])} in the parent, {_shape(ours[name])} here"
                     for name in ours if theirs[name] != ours[name])


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(str(n) for n in shape)


def layer_weights(model: keras.Model) -> dict[str, list[tuple[str, np.ndarray]]]:
    """Every layer of ``model`` that has weights: its name -> its weights' ``(name, values)``, in order."""
    return {layer.name: [(weight.name, np.asarray(keras.ops.convert_to_numpy(weight))) for weight in layer.weights]
            for layer in model.layers if layer.weights}


def weight_shapes(weights: Mapping[str, list[tuple[str, np.ndarray]]]) -> dict[str, Shapes]:
    return {layer: [(name, tuple(values.shape)) for name, values in pairs] for layer, pairs in weights.items()}


def layers_fingerprint(weights: Mapping[str, list[tuple[str, np.ndarray]]], layers: Sequence[str]) -> str:
    """A short hash of the weights of ``layers`` (their names, shapes and bytes, in that order):
    equal for a new model's taken layers and the parent's when every weight was taken exactly."""
    digest = hashlib.sha256()
    for layer in layers:
        for name, values in weights[layer]:
            values = np.ascontiguousarray(values)
            digest.update(f"{layer}/{name}:{values.dtype.str}:{values.shape}".encode())
            digest.update(values.tobytes())
    return digest.hexdigest()[:16]


def same_network(parent: ModelSpec, spec: ModelSpec) -> bool:
    """The same model for its weights: site, inputs, network size and resolution (dropout, which
    has no weights, aside)."""
    return dataclasses.replace(parent, dropout=spec.dropout) == spec


def describe_network(spec: ModelSpec) -> str:
    return (f"site {spec.site.name}, {spec.arch}, {spec.filters} filters × widths "
            f"{','.join(f'{width:g}' for width in spec.widths)} at {spec.resolution}³, {spec.norm} norm, {spec.head} head"
            + (", physics channel" if spec.physics else ""))


# -- the parent ---------------------------------------------------------------------------------
def resolve_parent(init_from: str, init_epoch: int | str, chosen: bool = True) -> tuple[dict, TrainConfig]:
    """``(record, config)``: the parent's record as ``config.json`` keeps it (model name, folder,
    site, epoch, checkpoint file relative to its folder, SHA-256) and its config. An
    :class:`InitFromError` for a folder that holds no trained model (a cross-validated model's
    folder: pick a fold) or lacks the checkpoint asked for. ``chosen``: False when ``init_epoch``
    is the default (no ``--init-epoch``): the parent's best where it has one, else its final
    checkpoint (a parent trained without validation patients has no best), said in one line."""
    folder = RunFolder(init_from)
    config = folder.read_config()
    if config is None:
        folds = fold_folders(folder.path)
        hint = (f"; {folder.path} is a cross-validated model: start from one of its folds, e.g. "
                f"--init-from {folds[min(folds)]}" if folds else "")
        raise InitFromError(f"Invalid `init_from`. Expected a trained model's folder, with "
                            f"{MODELS_FOLDER}/{CONFIG_FILE}{hint}. Received: init_from={init_from!r}")
    have = ", ".join(str(epoch) for epoch, _ in sorted(folder.checkpoints())) or "none"
    if not chosen and init_epoch == "best":
        if folder.read_best() is not None:
            logger.info("Starting from %s's best checkpoint (%s, epoch %d; no --init-epoch)", folder.path, BEST_FILE,
                        folder.read_best()["epoch"])
        elif folder.checkpoints():
            init_epoch = folder.checkpoints()[0][0]
            logger.info("Starting from %s's final checkpoint, epoch %d (it has no %s: no validation scoring; no "
                        "--init-epoch)", folder.path, init_epoch, BEST_FILE)
    if init_epoch == "best":
        best = folder.read_best()
        if best is None:
            raise InitFromError(f"Invalid `init_epoch`. Expected a checkpoint {folder.path} has: it has no "
                                f"{BEST_FILE} (no validation scoring), epochs {have}; pass --init-epoch N. "
                                f"Received: init_epoch='best'")
    elif not folder.checkpoint(int(init_epoch)).is_file():
        raise InitFromError(f"Invalid `init_epoch`. Expected a checkpoint {folder.path} has: epochs {have}"
                            f"{' or best' if folder.read_best() is not None else ''}. "
                            f"Received: init_epoch={init_epoch}")
    if init_epoch == "best" and folder.is_fold and folder.checkpoints():
        logger.warning("%s is a fold: its best.keras was picked on its own held-out patients; its commissioned "
                       "checkpoint is its final one (--init-epoch %d)", folder.path, folder.checkpoints()[0][0])
    record = {**folder.checkpoint_record(init_epoch), "site": config.site.name}
    return record, config


def parent_label(record: dict) -> str:
    """How a log line names a parent: its model name, epoch and checkpoint file."""
    return f"parent {record['model']!r} (epoch {record['epoch']}, {recorded_checkpoint(record)})"


@dataclasses.dataclass(frozen=True)
class ParentWeights:
    record: dict
    spec: ModelSpec
    weights: dict[str, list[tuple[str, np.ndarray]]]


def load_parent(record: dict, changed_remedy: str) -> ParentWeights:
    """The weights of the checkpoint ``record`` names (averaged ones, for a parent trained with
    ``--ema``), loaded through its run folder under its own dtype policy, the caller's restored
    after. Its SHA-256 is checked once the weights are read (and when they cannot be): a checkpoint
    that is not the recorded one is an :class:`InitFromError` that says so and ``changed_remedy``."""
    policy = keras.mixed_precision.global_policy()
    try:
        trained = RunFolder(record["folder"]).load_trained_model(
            "best" if Path(record["checkpoint"]).name == BEST_FILE else int(record["epoch"]))
        weights = layer_weights(trained.model)
    except Exception:
        _check_unchanged(record, changed_remedy)  # a file replaced since is said as such
        raise
    finally:
        keras.mixed_precision.set_global_policy(policy)
    _check_unchanged(record, changed_remedy)
    if trained.epoch != record["epoch"]:
        raise InitFromError(f"The parent's {recorded_checkpoint(record)} is epoch {trained.epoch}'s now, not the "
                            f"recorded epoch {record['epoch']}'s; {changed_remedy}")
    return ParentWeights(record, trained.spec, weights)


def _check_unchanged(record: dict, remedy: str) -> None:
    change = checkpoint_change(record)
    if change is not None:
        raise InitFromError(f"The parent's checkpoint {change}; {remedy}")


def take_weights(model: keras.Model, spec: ModelSpec, parent: ParentWeights) -> Matching:
    """Set ``model``'s layers that match the parent's (:func:`match_layers`) to the parent's weights;
    the others keep theirs. An :class:`InitFromError` when nothing matches."""
    own = {layer.name: layer for layer in model.layers if layer.weights}
    shapes = {name: [(weight.name, tuple(weight.shape)) for weight in layer.weights] for name, layer in own.items()}
    matching = match_layers(weight_shapes(parent.weights), shapes)
    if not matching.taken:
        raise InitFromError(f"Cannot start from {parent_label(parent.record)}: no layer of it has this model's "
                            f"name and weight shapes (the parent: {describe_network(parent.spec)}; this model: "
                            f"{describe_network(spec)}). Give the parent's network flags, or train without "
                            f"--init-from.")
    if same_network(parent.spec, spec) and (matching.not_taken or matching.unused):
        raise RuntimeError(f"The same network as the parent should take every weight; not taken: "
                           f"{matching.not_taken}, unused: {matching.unused}")
    for name in matching.taken:
        own[name].set_weights([values for _, values in parent.weights[name]])
    taken = layers_fingerprint(layer_weights(model), matching.taken)  # read back from the new model
    if taken != layers_fingerprint(parent.weights, matching.taken):
        raise RuntimeError(f"The layers taken from {parent_label(parent.record)} do not hold its weights after "
                           f"they were set: {', '.join(matching.taken)}")
    return dataclasses.replace(matching, fingerprint=taken)


def parent_record(parent: ParentWeights, matching: Matching) -> dict:
    """The record ``config.json`` keeps: the parent's, what was taken and not, and the fingerprint
    of the taken layers as the new model holds them, read back after they were set (equal to the
    parent's: :func:`take_weights` checks it)."""
    return {**parent.record, "taken": list(matching.taken),
            "not_taken": [{"layer": layer, "why": why} for layer, why in matching.not_taken],
            "taken_fingerprint": matching.fingerprint}
