#!/usr/bin/env python
"""How much of the dose the input channels explain by themselves: the physics channel against the
channels the networks have without it (docs/recipe.md, the body's comparison).

    python scripts/physics_information.py DATA_DIR [--resolution 64] [--cache-dir DIR]

DATA_DIR is make-data-dir.sh's folder (``train-pats``, ``validation-pats`` with doses). Each patient
is brought to ``--resolution`` as training brings it, and its input channels are made by the model's
own first layer (``--preset v2 --physics``: the CT, the structures, the prescription channel, the
nine beams' count channel, the physics channel). A linear model of the dose from a set of channels,
voxel by voxel inside the possible-dose mask, is fitted by least squares on the training patients
and scored on the validation patients: the mean over the patients of the mean absolute error (Gy,
against the dose at that resolution) and R² over all their voxels. No spatial context: the physics
channel is made from the CT, the targets and the beams, which the networks have anyway, so this
says only how much of it a voxel-wise linear model finds already in the other channels, not what
a network, which sees a neighbourhood, can make of any of them.

Prints JSON: ``sets`` (the channel sets, each with ``validation_mae_gy`` and ``validation_r2``),
the patients' counts, the resolution and the channel names.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from provided_code.infra.environment import configure_tensorflow  # noqa: E402

SETS = {  # a name -> the channels (by name) of its linear model
    "ct and structures": ("ct", "structures"),
    "+ prescription": ("ct", "structures", "prescription"),
    "+ prescription + beams": ("ct", "structures", "prescription", "beams"),
    "+ prescription + beams + physics": ("ct", "structures", "prescription", "beams", "physics"),
    "prescription + beams": ("prescription", "beams"),
    "prescription + beams + physics": ("prescription", "beams", "physics"),
    "physics alone": ("physics",),
}


def first_layer(resolution: int):
    """``(model, spec, columns)``: the model's first layer as a model of its own (``--preset v2 --physics``,
    the nine beams as one count channel) and its channels' columns by name, in ``CompactInputs``'s
    order: the CT, one per structure, the prescription, the beams' count, the physics channel."""
    import keras

    from provided_code.config import TrainConfig
    from provided_code.presets import PRESETS
    from provided_code.training.model import new_model

    spec = TrainConfig(resolution=resolution, filters=4, **{**PRESETS["v2"], "beams": 9, "physics": True}).spec
    model = new_model(spec, 1e-3)
    layer = model.get_layer("compact_inputs")
    structures = layer.structures
    columns = {"ct": [0], "structures": list(range(1, 1 + structures)), "prescription": [1 + structures],
               "beams": [2 + structures], "physics": [3 + structures]}
    if layer.output.shape[-1] != structures + 4:  # the layer's order is no longer the one above
        raise RuntimeError(f"the first layer makes {layer.output.shape[-1]} channels; expected the CT, {structures} "
                           f"structures, the prescription, the beams and physics")
    return keras.Model(model.inputs, layer.output), spec, columns


def patient_channels(layer, spec, data_dir: Path, split: str, cache_dir: str | None):
    """Per patient of the split: its channels and its dose inside the possible-dose mask."""
    from provided_code.data.batches import fit_vectors, take_inputs
    from provided_code.data.cache import load_split
    from provided_code.data.resample import downsample_split
    from provided_code.data_folder import split_dir

    full = load_split(split_dir(data_dir, split), cache_dir=cache_dir, site=spec.site)
    arrays = fit_vectors(downsample_split(full, spec.resolution), spec.inputs)
    channels, doses = [], []
    for row in range(len(arrays)):
        volume = np.asarray(layer(take_inputs(arrays, np.array([row]), spec.inputs)))[0]
        inside = arrays.possible_dose_mask[row] > 0
        channels.append(volume[inside].astype(np.float64))
        doses.append(arrays.dose[row][inside].astype(np.float64))
    return channels, doses


def linear_fit(train, validation, columns: list[int]) -> dict:
    """Least squares on the training patients' voxels; the validation patients' errors."""
    def design(x):
        return np.c_[x[:, columns], np.ones(len(x))]

    weights, *_ = np.linalg.lstsq(np.concatenate([design(x) for x in train[0]]), np.concatenate(train[1]),
                                  rcond=None)
    predictions = [design(x) @ weights for x in validation[0]]
    every_dose, every_prediction = np.concatenate(validation[1]), np.concatenate(predictions)
    r2 = 1 - np.sum((every_prediction - every_dose) ** 2) / np.sum((every_dose - every_dose.mean()) ** 2)
    mae = np.mean([np.mean(np.abs(p - d)) for p, d in zip(predictions, validation[1])])
    return {"validation_mae_gy": round(float(mae), 3), "validation_r2": round(float(r2), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    configure_tensorflow()
    layer, spec, columns = first_layer(args.resolution)
    train, validation = (patient_channels(layer, spec, args.data_dir, split, args.cache_dir)
                         for split in ("train", "validation"))
    sets = {name: {"channels": list(names),
                   **linear_fit(train, validation, [c for channel in names for c in columns[channel]])}
            for name, names in SETS.items()}
    print(json.dumps({"resolution": args.resolution, "training_patients": len(train[0]),
                      "validation_patients": len(validation[0]), "channels": list(columns), "sets": sets},
                     indent=2))


if __name__ == "__main__":
    main()
