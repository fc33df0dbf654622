"""The network a model spec names (``spec.arch``, :data:`provided_code.model_spec.ARCHS`), built:
the one place that chooses between the bodies, and each body's contract (:class:`NetworkBody`)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import keras

from provided_code.model_spec import ModelSpec
from provided_code.networks import resunet, unet
from provided_code.networks.blocks import in_encoder


@dataclasses.dataclass(frozen=True)
class NetworkBody:
    """What the training code asks of a body: its builder, its recompute blocks (``block_of``, a
    layer name's block or None: ``--recompute``) and its encoder (``in_encoder``: ``--freeze``).
    Its widths and head where a run names none are declared without Keras
    (:data:`provided_code.model_spec.BODIES`)."""

    build: Callable[[ModelSpec], keras.Model]
    block_of: Callable[[str], str | None]
    in_encoder: Callable[[str], bool]


NETWORK_BODIES = {
    "generator": NetworkBody(unet.build_unet, unet.block_of, in_encoder),
    "resunet": NetworkBody(resunet.build_resunet, resunet.block_of, in_encoder),
    "plain": NetworkBody(resunet.build_resunet, resunet.block_of, in_encoder),
}


def network_body(arch: str) -> NetworkBody:
    """The body called ``arch`` (one of :data:`provided_code.model_spec.ARCHS`)."""
    return NETWORK_BODIES[arch]


def build_network(spec: ModelSpec, keras_pooling: bool = False) -> keras.Model:
    """Build (not compile) the network ``spec`` describes: the 2020 generator
    (:func:`~provided_code.networks.unet.build_unet`; ``keras_pooling`` is its), the residual
    U-Net or its plain control (:func:`~provided_code.networks.resunet.build_resunet`)."""
    if spec.arch == "generator":
        return unet.build_unet(spec, keras_pooling=keras_pooling)
    return network_body(spec.arch).build(spec)
