#!/usr/bin/env python
"""What a configuration costs before it trains: prints one JSON line.

    python scripts/model_cost.py [the training command's flags]
    python scripts/model_cost.py --resolution 128 --filters 64                 # the README's card
    python scripts/model_cost.py --preset v2 --resolution 128 --filters 64     # the 2020 generator

Takes ``runpod_train.py``'s flags (a preset, the body, its widths, the resolution, the batch...),
builds the network they describe (nothing is trained, nothing read) and counts
(:mod:`provided_code.training.cost`, the arithmetic the training command logs at start-up and keeps
in ``config.json``): ``parameters``; ``gmac_per_sample``, the forward multiply-accumulates of every
convolution for one patient (a training step costs about three times the forward: forward and
backward); ``memory_gb``, the device memory of a training step at ``--batch-size`` (weights,
gradients, Adam's moments and every activation kept; ``recompute_memory_gb`` with
``--recompute``), an estimate by arithmetic, before XLA's and cuDNN's workspace;
``checkpoint_mb`` and ``disk_mb``, one checkpoint and what the rotation keeps (``--keep``, and
``best.keras`` when the run scores); and ``gmac_by_edge``, where the arithmetic is (the output
edge of each convolution, in voxels). ``--precision auto`` is counted as on a tensor-core GPU
(mixed_float16): the memory that matters is a GPU's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str]) -> None:
    import click

    from provided_code.apps.cli import main as train_command, settings
    from provided_code.apps.console import USER_ERRORS, one_line

    try:
        with train_command.make_context("model_cost.py", list(argv)) as ctx:
            config, _ = settings(ctx)
    except click.exceptions.Exit as done:  # --help
        raise SystemExit(done.exit_code) from None
    except click.ClickException as error:
        error.show()
        raise SystemExit(2) from None
    except USER_ERRORS as error:
        raise SystemExit(f"Error: {one_line(error)}") from None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from provided_code.infra.environment import configure_tensorflow

    configure_tensorflow()
    import keras

    from provided_code.networks.cost import macs_by_resolution
    from provided_code.training.cost import model_cost
    from provided_code.training.model import new_model

    policy = "mixed_float16" if config.precision == "auto" else config.precision
    keras.mixed_precision.set_global_policy(policy)
    model = new_model(config.spec, config.learning_rate, ema=config.ema)
    model.optimizer.build(model.trainable_variables)
    cost = model_cost(model, config)
    print(json.dumps({"arch": config.arch, "widths": config.widths, "head": config.head, "filters": config.filters,
                      "resolution": config.resolution, **cost,
                      "gmac_by_edge": {str(edge): round(macs / 1e9, 3)
                                       for edge, macs in macs_by_resolution(model).items()}}))


if __name__ == "__main__":
    main(sys.argv[1:])
