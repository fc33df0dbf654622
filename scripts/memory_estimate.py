#!/usr/bin/env python
"""What each network body needs in device memory for one training step, estimated from the
model's own layer shapes (no GPU here to measure it): prints one JSON object.

    python scripts/memory_estimate.py [--resolution 128] [--filters 64] [--batch-size 2]

For each body (``--arch generator`` and ``resunet``, each with and without ``--physics``), built
under ``mixed_float16`` with the default inputs (CT, structures, prescription, the nine beams):

- ``parameters``, and ``static_gb``: the weights, their gradients and Adam's two moments, float32
  (16 bytes a parameter);
- ``activations_gb``: every layer's output for the whole batch, in the layer's compute dtype
  (float16 but the float32 head and the input unpacking's own dtype): what the backward pass keeps
  when every activation is kept (an upper bound of what TensorFlow keeps: some outputs, e.g. a
  ReLU's input, are not needed twice; workspace of the convolutions comes on top);
- ``recompute_activations_gb`` (``--recompute``): the tensors that cross a block's border
  (the body's ``block_of``, :mod:`provided_code.networks.build`) for the whole batch, plus the largest block's own
  outputs for one sample (blocks without batch norm are recomputed one sample at a time);
- ``total_gb`` and ``recompute_total_gb``: static plus activations; ``fits_24_gb`` /
  ``fits_80_gb``: whether the total is under 90 % of an RTX 3090's / an H100's memory (the rest
  for the CUDA context, cuDNN's workspace and the allocator's fragmentation).

GB are 10^9 bytes. An estimate by arithmetic, not a measurement: :mod:`provided_code.networks.cost`'s,
which ``scripts/model_cost.py`` and the training command use too (for any flags).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def estimate(arch: str, physics: bool, resolution: int, filters: int, batch: int) -> dict:
    import keras

    from provided_code.config import TrainConfig
    from provided_code.networks.build import build_network, network_body
    from provided_code.networks.cost import memory_estimate

    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        spec = TrainConfig(arch=arch, physics=physics, resolution=resolution, filters=filters,
                           dropout=0.2 if arch == "generator" else 0.0).spec
        model = build_network(spec)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return memory_estimate(model, batch, network_body(arch).block_of)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--filters", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from provided_code.infra.environment import configure_tensorflow

    configure_tensorflow()
    result = {"settings": {"resolution": args.resolution, "filters": args.filters, "batch_size": args.batch_size,
                           "policy": "mixed_float16", "gb": "1e9 bytes"}}
    for arch in ("generator", "resunet"):
        for physics in (False, True):
            result[f"{arch}{'_physics' if physics else ''}"] = estimate(arch, physics, args.resolution, args.filters,
                                                                       args.batch_size)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
