"""One optimizer update on ``tf.distribute``, for one device, several GPUs or several machines.

Per replica: the loss and gradients of its share of the update (XLA-compiled when asked), summed
over ``accumulate`` micro-batches one after another; then the loss-scale finite check, agreed by
all replicas; then ``optimizer.apply``, which all-reduces (sums) the gradients across replicas and
updates the weights. Each patient's loss carries a weight: the weights of an update sum to 1 over
its real patients, so the summed gradient is that of the update's mean loss however it is split.
"""

from __future__ import annotations

import logging

import keras
import tensorflow as tf

from provided_code.data.tf_augment import apply_geometry
from provided_code.data.tf_dataset import TrainingElement
from provided_code.model_spec import ModelSpec
from provided_code.networks.build import network_body
from provided_code.training.recompute import training_forward

logger = logging.getLogger(__name__)


def is_sync_layer(layer) -> bool:
    """Layers whose training call all-reduces across replicas."""
    return isinstance(layer, keras.layers.BatchNormalization) and layer.synchronized


class TrainStep:
    """``train(element) -> loss`` and ``evaluate(dataset) -> mean loss``, each a ``tf.function``.

    ``xla``: the whole per-replica loss-and-gradients function is compiled, unless several replicas
    share synchronised batch norm (``--norm batch``): its all-reduce cannot sit inside a compiled
    function on this stack, so that step runs uncompiled, and says so.
    ``recompute``: encoder and decoder blocks are recomputed in the backward pass.
    ``loss_fn(element, predicted)``: per-patient losses (``provided_code.losses``; no default here:
    the run's comes from its config). Training elements that carry augmentation draws are moved by
    them first, on the device. ``spec``: the model's :class:`~provided_code.model_spec.ModelSpec`,
    whose declared inputs say what the step feeds it and how augmentation moves each.

    Loss normalisation lives in the data layer alone: each patient's ``weight`` (the update's real
    patients sum to 1, padding weighs 0), so a replica's share of any term, the regularisers too,
    is its patients' weight sum, and the update's summed gradient is its mean loss's.

    ``frozen``: trainable variables whose gradients are zeroed while :meth:`set_frozen` says so
    (``--freeze``, :mod:`provided_code.training.freeze`: Adam then leaves them exactly as they are).
    """

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy, batch_size: int, xla: bool,
                 accumulate: int = 1, recompute: bool = False, *, loss_fn, spec: ModelSpec, frozen=()):
        self.model = model
        self.inputs = spec.inputs
        self.input_names = spec.input_names
        expected = sorted(getattr(t, "name", None) for t in model.inputs)
        if sorted(self.input_names) != expected:
            raise ValueError(f"Invalid `spec`. Expected the model's inputs {expected}. "
                             f"Received: spec with inputs {list(self.input_names)}")
        self.strategy = strategy
        self.batch_size = batch_size
        self.accumulate = accumulate
        self.loss_fn = loss_fn
        self.replicas = strategy.num_replicas_in_sync
        self.loss_scaling = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        # Synchronised batch norm's all-reduce cannot sit inside a compiled function (it needs a
        # merge_call): with several replicas and batch norm, no XLA. Instance norm (the default) or
        # one replica: the whole replica step compiles.
        synchronised = self.replicas > 1 and any(is_sync_layer(layer) for layer in model.layers)
        if xla and synchronised:
            logger.warning("XLA off for the training step: batch norm synchronised over %d replicas cannot run "
                           "inside a compiled function (--norm instance compiles the whole step on any number of "
                           "replicas)", self.replicas)
        frozen_paths = {variable.path for variable in frozen}
        self._frozen = frozenset(index for index, variable in enumerate(model.trainable_variables)
                                 if variable.path in frozen_paths)
        if len(self._frozen) != len(frozen_paths):
            raise ValueError(f"Invalid `frozen`. Expected trainable variables of the model. Received: "
                             f"{sorted(frozen_paths - {v.path for v in model.trainable_variables})}")
        self._freezing = tf.Variable(False, trainable=False, name="freezing") if self._frozen else None
        self._forward = training_forward(model, recompute_blocks=recompute, block_of=network_body(spec.arch).block_of)
        compile_whole = xla and not synchronised
        # autograph=False: the steps' control flow is Python's, decided while tracing (micro-batches,
        # frozen variables, loss scaling); autograph's rewriting of every function they call took a
        # third of a short run's first epoch, for nothing (scripts/bench_train.py --part trace).
        self._loss_and_grads = tf.function(self._replica_loss_and_grads, jit_compile=True, autograph=False) \
            if compile_whole else self._replica_loss_and_grads
        self._eval_loss = tf.function(self._replica_eval_loss_body, jit_compile=xla,  # XLA only with --xla
                                      autograph=False)
        self.train = tf.function(self._distributed_train, autograph=False)
        self._evaluate = tf.function(self._distributed_evaluate, autograph=False)

    # -- per replica -------------------------------------------------------------------------
    def _replica_loss_and_grads(self, element: TrainingElement):
        model = self.model
        element = apply_geometry(element, self.inputs)
        with tf.GradientTape() as tape:
            predicted = self._forward({name: element[name] for name in self.input_names})
            loss = tf.reduce_sum(element["weight"] * self.loss_fn(element, predicted))
            if model.losses:  # regularisers: once per update, shared by the weights of its patients
                loss += tf.add_n(model.losses) * tf.reduce_sum(element["weight"])
            scaled = model.optimizer.scale_loss(loss) if self.loss_scaling else loss
        return loss, tape.gradient(scaled, model.trainable_variables)

    def _local_device(self) -> str:
        """This replica's device. Nested XLA functions must be pinned to it: XLA otherwise places
        them on the first device, away from the replica's variables."""
        return self.model.trainable_variables[0].value.device

    def _replica_update(self, element):
        with tf.device(self._local_device()):
            return self._replica_update_on_device(element)

    def _replica_update_on_device(self, element):
        total_loss, total_grads = 0.0, None
        for micro in range(self.accumulate):  # one after another: only one micro-batch's activations live
            part = {name: value[micro * self.batch_size:(micro + 1) * self.batch_size] for name, value in element.items()}
            if total_grads is not None:
                with tf.control_dependencies([g for g in total_grads if g is not None]):
                    part = {name: tf.identity(value) for name, value in part.items()}
            loss, grads = self._loss_and_grads(part)
            total_loss += loss
            total_grads = grads if total_grads is None else [
                a if b is None else (b if a is None else a + b) for a, b in zip(total_grads, grads)]
        if self._frozen:  # zero, not None: every variable keeps its place in the optimizer's update
            total_grads = [tf.where(self._freezing, tf.zeros_like(g), g) if index in self._frozen and g is not None
                           else g for index, g in enumerate(total_grads)]
        if self.loss_scaling:
            total_grads = self._agree_on_finite(total_grads)
        self.model.optimizer.apply(total_grads, self.model.trainable_variables)
        return total_loss

    def _agree_on_finite(self, grads):
        """Make every replica see non-finite gradients if any replica has them.

        Keras's LossScaleOptimizer decides from the first local replica's gradients, before the
        all-reduce: a non-finite gradient on another replica would reach the weights (one device)
        or send workers down different branches (several machines). A NaN added to the first
        gradient of every replica makes all of them skip the update and lower the scale together.
        """
        local_bad = 1.0 - tf.cast(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None]),
                                  tf.float32)
        bad = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local_bad)
        poison = tf.where(bad > 0, float("nan"), 0.0)
        first = next(i for i, g in enumerate(grads) if g is not None)
        grads = list(grads)
        grads[first] = grads[first] + tf.cast(poison, grads[first].dtype)
        return grads

    def _replica_eval_loss(self, element):
        with tf.device(self._local_device()):
            return self._eval_loss(element)

    def _replica_eval_loss_body(self, element: TrainingElement):
        predicted = self.model({name: element[name] for name in self.input_names}, training=False)
        return tf.reduce_sum(element["weight"] * self.loss_fn(element, predicted))

    def set_frozen(self, frozen: bool) -> bool:
        """Hold the ``frozen`` variables (True) or let them train (False) from the next update on;
        returns the previous state (False without frozen variables, which nothing holds)."""
        if self._freezing is None:
            return False
        before = bool(self._freezing.numpy())
        self._freezing.assign(frozen)
        return before

    # -- across replicas ----------------------------------------------------------------------
    def _distributed_train(self, element):
        losses = self.strategy.run(self._replica_update, args=(element,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def _distributed_evaluate(self, element):
        losses = self.strategy.run(self._replica_eval_loss, args=(element,))
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def evaluate(self, dataset, patients: int) -> float:
        """Mean loss over ``patients`` real patients of a dataset weighted 1 (real) / 0 (padding)."""
        total = [self._evaluate(element) for element in dataset]
        return float(tf.add_n(total)) / patients
