"""How a body's layers are grouped into blocks, by name: what ``--recompute`` recomputes and what
``--freeze encoder`` holds. Every body (:mod:`provided_code.networks.build`) names its layers
``encoder_<k>_*`` and ``decoder_<k>_*``; each declares, beside its builder, the few layers outside
that pattern (:func:`block_map`)."""

from __future__ import annotations

import re
from typing import Callable

_BLOCK_PREFIX = re.compile(r"^((?:encoder|decoder)_\d+)_")
_ENCODER_LAYER = re.compile(r"^encoder_\d+_")


def block_map(named: dict[str, str]) -> Callable[[str], str | None]:
    """A body's recompute blocks: every layer ``encoder_<k>_*`` / ``decoder_<k>_*`` belongs to
    block ``encoder_<k>`` / ``decoder_<k>``, the layers of ``named`` to the block it gives them (the
    input unpacking goes with the first convolution, so that only the compact uint16 inputs are
    kept; the output layers with the last decoder block). Dropout layers belong to no block (a
    second run would draw other numbers); so does anything else."""
    named = dict(named)

    def block_of(layer_name: str) -> str | None:
        if layer_name.endswith("_dropout"):
            return None
        match = _BLOCK_PREFIX.match(layer_name)
        return named.get(layer_name, match.group(1) if match else None)

    return block_of


def in_encoder(layer_name: str) -> bool:
    """Whether the layer called ``layer_name`` is the encoder's: ``encoder_<k>_*``, its
    convolutions and their normalisations (what ``--freeze encoder`` holds fixed)."""
    return _ENCODER_LAYER.match(layer_name) is not None
