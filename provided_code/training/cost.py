"""What a run's model costs before it trains: its parameters, its forward arithmetic per sample,
the device memory of a training step at the run's batch, and the disk its checkpoints take.

The arithmetic is :mod:`provided_code.networks.cost`'s, on the model as built (under the run's
dtype policy, which sets the activations' bytes). Read by the training command (which logs the
first three at start-up and keeps them in ``config.json``) and by ``scripts/model_cost.py``.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from provided_code.config import TrainConfig
from provided_code.networks.build import network_body
from provided_code.networks.cost import forward_macs, memory_estimate

# A .keras file beyond its arrays: its config and metadata, and HDF5's headers per variable (measured on the
# bodies at 32³ and 64³: 115 to 300 kB, 0.9 to 1.3 kB a variable)
FILE_OVERHEAD_BYTES = 50_000
VARIABLE_OVERHEAD_BYTES = 1_300


def checkpoint_bytes(model: keras.Model) -> int:
    """The bytes of one ``.keras`` checkpoint of ``model``: every weight and every optimizer variable
    (Adam's two moments, the loss scale, the averaged weights with ``--ema``) as stored, plus the
    file's overhead; build the optimizer first (``model.optimizer.build``). An estimate: within 5 %
    of the files saved (the arrays are most of a file but for the smallest models)."""
    optimizer = getattr(model, "optimizer", None)  # a model loaded to predict has none
    variables = list(model.weights) + (list(optimizer.variables) if optimizer is not None else [])
    return sum(math.prod(variable.shape) * np.dtype(keras.backend.standardize_dtype(variable.dtype)).itemsize
               for variable in variables) + FILE_OVERHEAD_BYTES + VARIABLE_OVERHEAD_BYTES * len(variables)


def model_cost(model: keras.Model, config: TrainConfig) -> dict:
    """``model``'s cost for ``config``'s run (see the module): ``parameters``, ``gmac_per_sample``
    (forward, every convolution), ``memory_gb`` at ``batch_size`` per device (weights, gradients,
    Adam, every activation kept: :func:`~provided_code.networks.cost.memory_estimate`; GB are 10^9
    bytes) with ``recompute_memory_gb`` (``--recompute``), ``checkpoint_mb`` and ``disk_mb``: the
    checkpoints the rotation keeps (``keep``) and ``best.keras`` when the run scores."""
    memory = memory_estimate(model, config.batch_size, network_body(config.arch).block_of)
    one = checkpoint_bytes(model)
    kept = config.keep + (1 if config.score_every else 0)
    return {"parameters": memory["parameters"], "gmac_per_sample": round(forward_macs(model) / 1e9, 3),
            "batch_size": config.batch_size, "policy": model.dtype_policy.name,
            "memory_gb": memory["total_gb"], "recompute_memory_gb": memory["recompute_total_gb"],
            "checkpoint_mb": round(one / 1e6, 1), "disk_mb": round(kept * one / 1e6, 1)}
