"""The network a model spec names (``spec.arch``, :data:`provided_code.model_spec.ARCHS`), built:
the one place that chooses between the bodies."""

from __future__ import annotations

import keras

from provided_code.model_spec import ModelSpec
from provided_code.networks.resunet import build_resunet
from provided_code.networks.unet import build_unet


def build_network(spec: ModelSpec, keras_pooling: bool = False) -> keras.Model:
    """Build (not compile) the network ``spec`` describes: the 2020 generator
    (:func:`~provided_code.networks.unet.build_unet`; ``keras_pooling`` is its) or the residual
    U-Net (:func:`~provided_code.networks.resunet.build_resunet`)."""
    if spec.arch == "resunet":
        return build_resunet(spec)
    return build_unet(spec, keras_pooling=keras_pooling)
