"""A new model and its optimizer, made in one place: training, the benchmarks and the tests start
from here."""

from __future__ import annotations

import keras

from provided_code.model_spec import ModelSpec
from provided_code.networks.build import build_network
from provided_code.training.ema import EMA_MOMENTUM


def new_optimizer(learning_rate: float, ema: bool = False, ema_momentum: float = EMA_MOMENTUM) -> keras.optimizers.Optimizer:
    """Adam with the OpenKBP starter's betas (0.5, 0.999); with ``ema``, keeping a moving average
    of the weights with ``ema_momentum`` per update (``training/ema.py``)."""
    return keras.optimizers.Adam(learning_rate, beta_1=0.5, beta_2=0.999, use_ema=ema, ema_momentum=ema_momentum)


def new_model(spec: ModelSpec, learning_rate: float, ema: bool = False, ema_momentum: float = EMA_MOMENTUM,
              keras_pooling: bool = False) -> keras.Model:
    """The network ``spec`` describes (its ``arch``), compiled with its optimizer (``learning_rate``; with ``ema``,
    weight averaging) under the current dtype policy (Keras wraps the optimizer for loss scaling
    under ``mixed_float16``). No loss is compiled: the training step computes its own
    (``provided_code.losses``)."""
    model = build_network(spec, keras_pooling=keras_pooling)
    model.compile(optimizer=new_optimizer(learning_rate, ema=ema, ema_momentum=ema_momentum))
    return model
