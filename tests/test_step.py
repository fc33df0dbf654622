"""The training step: gradient accumulation, recomputation, and the loss-scale check across replicas."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from provided_code.data.tf_dataset import take_element
from provided_code.losses import mean_absolute_error
from provided_code.networks.layers import CompactInputs
from provided_code.sites import load_site
from provided_code.training.model import new_model
from provided_code.training.step import TrainStep
from provided_code.training.train import model_weights
from tests.kit.runs import model_spec
from tests.kit.skips import requires_float16_convolutions
from tests.kit.tiers import SLOW_FOR_ITS_TIME

STRUCTURES = load_site("openkbp").names  # OpenKBP's channel order

SIZE = 16
SPEC = model_spec(resolution=SIZE)  # OpenKBP's network: it eats the CT and the packed structures


pytestmark = pytest.mark.usefixtures("reset_keras")


class Arrays:
    """A stand-in for SplitArrays: random compact volumes of 4 patients at SIZE³."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        shape = (4, SIZE, SIZE, SIZE)
        self.ct = rng.integers(0, 4096, shape).astype(np.uint16)
        self.structure_masks = rng.integers(0, 1024, shape).astype(np.uint16)
        self.dose = rng.uniform(0, 70, shape).astype(np.float32)


def element(arrays, rows, weights):
    taken = take_element(arrays, np.array(rows), np.array(weights, np.float32), SPEC.inputs)
    return {name: tf.constant(value) for name, value in taken.items()}


def small_model_without_batch_norm():
    keras.utils.set_random_seed(1)
    shape = (SIZE, SIZE, SIZE)
    ct = keras.Input(shape, dtype="uint16", name="ct")
    structure_masks = keras.Input(shape, dtype="uint16", name="structure_masks")
    x = CompactInputs()([ct, structure_masks])
    x = keras.layers.Conv3D(4, 3, padding="same", activation="relu")(x)
    dose = keras.layers.Conv3D(1, 3, padding="same")(x)
    model = keras.Model({"ct": ct, "structure_masks": structure_masks}, dose)
    model.compile(optimizer=keras.optimizers.SGD(0.01))
    model.optimizer.build(model.trainable_variables)
    return model


def test_accumulating_two_batches_of_one_equals_one_batch_of_two():
    arrays = Arrays()
    strategy = tf.distribute.get_strategy()
    whole = small_model_without_batch_norm()
    loss_whole = TrainStep(whole, strategy, batch_size=2, xla=False, loss_fn=mean_absolute_error, spec=SPEC).train(
        element(arrays, [2, 0], [0.5, 0.5]))
    accumulated = small_model_without_batch_norm()
    step = TrainStep(accumulated, strategy, batch_size=1, xla=False, accumulate=2, loss_fn=mean_absolute_error,
                     spec=SPEC)
    loss_accumulated = step.train(element(arrays, [2, 0], [0.5, 0.5]))  # micro-batches [2], [0]
    # float32: two micro-batch means averaged against one mean of both (reassociated sums): ~1e-7 relative.
    assert float(loss_accumulated) == pytest.approx(float(loss_whole), rel=1e-6)
    before = small_model_without_batch_norm()
    changed = False
    for a, b, c in zip(model_weights(whole), model_weights(accumulated), model_weights(before)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)  # one Adam update of ~1e-3 from gradients ~1e-7 apart
        changed |= not np.allclose(a, c)
    assert changed  # the update happened


def test_padding_patients_weigh_nothing():
    arrays = Arrays()
    strategy = tf.distribute.get_strategy()
    model = small_model_without_batch_norm()
    def step(batch_size):
        return TrainStep(model, strategy, batch_size=batch_size, xla=False, loss_fn=mean_absolute_error, spec=SPEC)

    one = float(step(1)._evaluate(element(arrays, [1], [1.0])))
    padded = float(step(2)._evaluate(element(arrays, [1, 3], [1.0, 0.0])))
    assert padded == pytest.approx(one, rel=1e-6)  # a batch of 2 runs other oneDNN kernels than 1: float32 ulps


def unet_steps(recompute: bool, steps: int = 3):
    keras.backend.clear_session()
    keras.utils.set_random_seed(3)
    model = new_model(model_spec(resolution=SIZE, filters=4, dropout=0.2), 1e-3)
    model.optimizer.build(model.trainable_variables)
    step = TrainStep(model, tf.distribute.get_strategy(), batch_size=2, xla=False, recompute=recompute,
                     loss_fn=mean_absolute_error, spec=SPEC)
    arrays = Arrays()
    losses = [float(step.train(element(arrays, rows, [0.5, 0.5]))) for rows in ([0, 1], [2, 3], [1, 2])[:steps]]
    return losses, model_weights(model)


@SLOW_FOR_ITS_TIME
def test_recompute_gives_the_same_losses_weights_and_batch_norm_statistics():
    losses, weights = unet_steps(recompute=False)
    again, weights_again = unet_steps(recompute=True)
    # recomputation runs the same float32 ops, one sample at a time in places: other kernels, ~1e-6 relative
    # per step, compounded over three updates: losses within 1e-5, weights within 1e-4 relative or 1e-5.
    np.testing.assert_allclose(again, losses, rtol=1e-5)
    assert losses[0] != losses[-1]
    for a, b in zip(weights, weights_again):  # moving mean/variance included: updated once per step
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def traced_train_step(recompute: bool):
    keras.backend.clear_session()
    model = new_model(model_spec(resolution=SIZE, filters=4, dropout=0.0), 1e-3)
    model.optimizer.build(model.trainable_variables)
    step = TrainStep(model, tf.distribute.get_strategy(), batch_size=2, xla=False, recompute=recompute,
                     loss_fn=mean_absolute_error, spec=SPEC)
    spec = {name: tf.TensorSpec(value.shape, value.dtype) for name, value in element(Arrays(), [0, 1], [0.5, 0.5]).items()}
    return step.train.get_concrete_function(spec).graph, model.get_layer("compact_inputs").output.shape[-1]


def test_recompute_runs_the_blocks_again_and_the_unpacked_input_one_sample_at_a_time():
    """The traced step holds a second forward run of the blocks; the first convolution, which reads
    the unpacked input (the step's largest tensor), runs per sample, forward and again backward,
    so only one sample of that tensor exists. (The memory this saves is measured by
    scripts/bench_train.py, not here.)"""
    (kept, unpacked), (recomputed, _) = traced_train_step(False), traced_train_step(True)
    assert unpacked == 1 + len(STRUCTURES) + 2  # CT, structures, prescription, beams (the default network)

    def convolutions(graph):
        return sum(op.type in ("Conv3D", "Conv3DBackpropInputV2") for op in graph.get_operations())

    def first_convolution_batches(graph):
        return sorted(op.inputs[0].shape[0] for op in graph.get_operations()
                      if op.type == "Conv3D" and op.inputs[0].shape[-1] == unpacked)

    assert convolutions(recomputed) > convolutions(kept)
    assert first_convolution_batches(kept) == [2]
    assert first_convolution_batches(recomputed) == [1, 1, 1, 1]  # 2 samples, forward and backward


LOSS_SCALE_PROBE = textwrap.dedent("""
    import numpy as np
    from provided_code.infra.environment import configure_tensorflow
    configure_tensorflow()
    import keras, tensorflow as tf
    from provided_code.training.strategy import make_placement
    strategy = make_placement("2").strategy
    from provided_code.networks.layers import CompactInputs
    from provided_code.losses import mean_absolute_error
    from provided_code.training.step import TrainStep
    keras.mixed_precision.set_global_policy("mixed_float16")
    with strategy.scope():  # no batch norm: its synchronised backward pass would spread the inf by itself
        inputs = {name: keras.Input((16, 16, 16), dtype="uint16", name=name) for name in ("ct", "structure_masks")}
        x = keras.layers.Conv3D(4, 3, padding="same")(CompactInputs()([inputs["ct"], inputs["structure_masks"]]))
        model = keras.Model(inputs, keras.layers.Conv3D(1, 3, padding="same", dtype="float32")(x))
        model.compile(optimizer=keras.optimizers.Adam(1e-3))
        model.optimizer.build(model.trainable_variables)
    from provided_code.config import TrainConfig
    step = TrainStep(model, strategy, batch_size=1, xla=False, loss_fn=mean_absolute_error, spec=TrainConfig().spec)
    before = [np.array(v) for v in model.trainable_weights]
    scale = float(model.optimizer.dynamic_scale.numpy())
    ct = np.zeros((2, 16, 16, 16), np.uint16)
    dose = np.ones((2, 16, 16, 16, 1), np.float32)
    weight = np.array([0.5, np.inf], np.float32)  # an inf on replica 1 only: its gradients are not finite
    def value_fn(context):
        r = context.replica_id_in_sync_group
        return {"ct": ct[r:r + 1], "structure_masks": ct[r:r + 1], "dose": dose[r:r + 1], "weight": weight[r:r + 1]}
    step.train(strategy.experimental_distribute_values_from_function(value_fn))
    replicas = [[strategy.experimental_local_results(v.value)[r].numpy() for v in model.trainable_weights]
                for r in range(2)]
    for r in range(2):
        assert all(np.isfinite(w).all() for w in replicas[r]), "NaN weights on replica %d" % r
        assert all(np.array_equal(a, b) for a, b in zip(replicas[r], before)), "replica %d updated" % r
    new_scale = float(model.optimizer.dynamic_scale.numpy())
    assert new_scale == scale / 2, (scale, new_scale)
    print("OK", scale, new_scale)
""")


@pytest.mark.slow
@requires_float16_convolutions
def test_non_finite_gradient_on_one_replica_skips_the_update_on_every_replica():
    result = subprocess.run([sys.executable, "-c", LOSS_SCALE_PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


def test_the_network_declares_its_recompute_blocks_and_a_model_without_them_is_refused():
    from provided_code.networks.unet import block_of

    model = new_model(model_spec(resolution=SIZE, filters=2, dropout=0.2), 1e-3)
    blocks = {layer.name: block_of(layer.name) for layer in model.layers}
    assert blocks["compact_inputs"] == blocks["encoder_1_conv"] == "inputs" and blocks["dose"] == "decoder_0"
    assert {name for name, block in blocks.items() if block is None} == (
        {layer.name for layer in model.layers if isinstance(layer, keras.layers.InputLayer)}
        | {layer.name for layer in model.layers if isinstance(layer, keras.layers.SpatialDropout3D)})
    shape = (SIZE, SIZE, SIZE)
    inputs = {name: keras.Input(shape, dtype="uint16", name=name) for name in ("ct", "structure_masks")}
    unpacked = CompactInputs(name="unpack")([inputs["ct"], inputs["structure_masks"]])  # a name of no block
    renamed = keras.Model(inputs, keras.layers.Conv3D(1, 3, padding="same", name="conv")(unpacked))
    renamed.compile(optimizer=keras.optimizers.SGD(0.01))
    with pytest.raises(ValueError, match="--recompute found no block in model"):
        TrainStep(renamed, tf.distribute.get_strategy(), batch_size=1, xla=False, recompute=True,
                  loss_fn=mean_absolute_error, spec=SPEC)
