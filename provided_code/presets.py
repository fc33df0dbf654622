"""Named sets of every recipe and network choice (``--preset``); explicit flags override them.

- ``starter``: the OpenKBP 2020 starter recipe: plain MAE over the whole volume, no
  augmentation, constant rate, batch norm, CT and masks only.
- ``v1``: this project's first recipe (docs/recipe.md's 30-epoch comparison): masked MAE, flips,
  constant rate, batch norm, CT and masks only.
- ``v2``: the second default, chosen by docs/recipe.md's longer comparison: ``v1`` with instance
  norm, the prescription channel, the site's beams' channel and a cosine schedule, on the generator.
- ``default``: ``TrainConfig``'s defaults.
- ``finetune``: the recipe of a small cohort's model started from a trained one (``--init-from``),
  chosen by docs/recipe.md's fine-tuning comparison (``scripts/finetune_comparison.py``). It sets
  the recipe only (``FINETUNE_FIELDS``: the rate, warm-up, schedule and freezing among them): the
  network is the parent's.

``models/config.json`` records the resolved values, so a resume or a ``--predict-only`` needs no
preset.
"""

from __future__ import annotations

from provided_code.config import TrainConfig, field_defaults
from provided_code.errors import ConfigError

_DEFAULTS = field_defaults()
PRESET_FIELDS = ("arch", "widths", "head", "dropout", "learning_rate", "physics", "loss", "augment", "lr_schedule", "warmup_epochs", "ema", "norm", "prescription_channel", "beams",
                 "beam_angles", "beam_channels", "dvh_weight")
_NO_BEAMS = {"beams": 0, "beam_angles": "", "beam_channels": "count"}
_GENERATOR = {"arch": "generator", "widths": "1,2,4,8,8,8", "head": "relu"}  # the 2020 generator as it was
PRESETS: dict[str, dict] = {
    "starter": {**_GENERATOR, "dropout": 0.2, "learning_rate": 2e-4, "physics": False, "loss": "mae", "augment": "none", "lr_schedule": "constant", "warmup_epochs": 0, "ema": False,
                "norm": "batch", "prescription_channel": False, **_NO_BEAMS, "dvh_weight": 0.0},
    "v1": {**_GENERATOR, "dropout": 0.2, "learning_rate": 2e-4, "physics": False, "loss": "masked-mae", "augment": "flip", "lr_schedule": "constant", "warmup_epochs": 0, "ema": False,
           "norm": "batch", "prescription_channel": False, **_NO_BEAMS, "dvh_weight": 0.0},
    # the default until the residual U-Net's comparison (docs/recipe.md): the generator, instance norm, the
    # prescription and beams' channels, cosine
    "v2": {**_GENERATOR, "dropout": 0.2, "learning_rate": 2e-4, "physics": False, "loss": "masked-mae", "augment": "flip", "lr_schedule": "cosine",
           "warmup_epochs": 0, "ema": False, "norm": "instance", "prescription_channel": True, "beams": None,
           "beam_angles": "", "beam_channels": "count", "dvh_weight": 0.0},
    "default": {name: _DEFAULTS[name] for name in PRESET_FIELDS},
    # a fine-tune's recipe, no network choice (those are the parent's): FINETUNE_FIELDS.
    # The middle of the comparison's rates: never its worst arm, within 0.07 Gy dose / 0.16 Gy DVH score of its best
    "finetune": {"loss": "masked-mae", "augment": "flip", "lr_schedule": "cosine", "warmup_epochs": 2, "ema": False,
                 "dvh_weight": 0.0, "learning_rate": 1e-4, "freeze": "none", "freeze_epochs": 0},
}
FINETUNE_FIELDS = tuple(PRESETS["finetune"])


def preset_network(name: str) -> dict:
    """The network fields (``TrainConfig.NETWORK``) preset ``name`` sets: what shapes the weights of a
    model built with it (``{}`` for ``finetune``, which leaves the network to the parent)."""
    return {field: value for field, value in PRESETS[name].items() if field in TrainConfig.NETWORK}


def apply_preset(name: str | None, options: dict, given: set[str]) -> dict:
    """``options`` (flag values by field name) with the preset's values for every field the user
    did not give explicitly (``given``). The fields a preset sets are its keys (``PRESET_FIELDS``,
    or ``FINETUNE_FIELDS`` for ``finetune``)."""
    if name is None:
        return dict(options)
    if name not in PRESETS:
        raise ConfigError(f"Invalid `preset`. Expected one of {tuple(PRESETS)}. Received: preset={name!r}")
    return {**options, **{field: value for field, value in PRESETS[name].items() if field not in given}}

