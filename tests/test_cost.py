"""What a network costs (networks/cost.py, training/cost.py) and scripts/model_cost.py."""

import json
import subprocess
import sys

import keras
import pytest

from provided_code.config import TrainConfig
from provided_code.networks.build import network_body
from provided_code.networks.cost import forward_macs, macs_by_resolution, memory_estimate
from provided_code.training.cost import checkpoint_bytes, model_cost
from provided_code.training.model import new_model
from tests.kit.repo import REPO

pytestmark = pytest.mark.usefixtures("reset_keras")


def test_multiply_accumulates_are_counted_by_hand_for_each_kind_of_convolution():
    inputs = keras.Input((8, 8, 8, 3))
    down = keras.layers.Conv3D(4, 3, strides=2, padding="same")(inputs)  # 4³ out × 27 × 3 × 4
    up = keras.layers.Conv3DTranspose(2, 2, strides=2)(down)  # 4³ in × 8 × 4 × 2
    head = keras.layers.Conv3D(1, 1)(keras.layers.ReLU()(up))  # 8³ × 1 × 2 × 1
    model = keras.Model(inputs, head)
    assert forward_macs(model) == 64 * 27 * 3 * 4 + 64 * 8 * 4 * 2 + 512 * 2
    assert macs_by_resolution(model) == {8: 64 * 8 * 4 * 2 + 512 * 2, 4: 64 * 27 * 3 * 4}


def test_memory_counts_weights_adam_and_every_output_in_its_compute_dtype():
    keras.mixed_precision.set_global_policy("mixed_float16")
    inputs = keras.Input((8, 8, 8, 1))
    hidden = keras.layers.Conv3D(4, 3, padding="same", name="encoder_1_conv")(inputs)
    out = keras.layers.Conv3D(1, 1, dtype="float32", name="dose")(hidden)
    model = keras.Model(inputs, out)
    estimate = memory_estimate(model, batch_size=2)
    parameters = (27 * 4 + 4) + (4 + 1)
    activations = 2 * 512 * 4 * 2 + 2 * 512 * 1 * 4  # float16 hidden, float32 head
    assert estimate["parameters"] == parameters
    assert estimate["total_gb"] == round((16 * parameters + activations) / 1e9, 2)
    assert estimate["activations_gb"] == round(activations / 1e9, 2) and "recompute_total_gb" not in estimate


def test_the_cards_default_is_counted_as_the_issue_table_has_it_and_the_generator_too():
    """The bodies at 128³ and 64 filters under mixed_float16, as counted before the widths were a
    setting: 1,939 and 110 GMAC, 13.26 and 2.76 GB at batch 2 (docs/performance.md)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    from provided_code.networks.build import build_network

    for arch, widths, gmac, total in (("resunet", "1,2,4,8,8,8", 1938.9, 13.26), ("generator", "", 109.8, 2.76)):
        keras.backend.clear_session()
        keras.mixed_precision.set_global_policy("mixed_float16")
        config = TrainConfig(arch=arch, widths=widths, dropout=0.2 if arch == "generator" else 0.0)
        model = build_network(config.spec)
        assert round(forward_macs(model) / 1e9, 1) == gmac
        assert memory_estimate(model, 2, network_body(arch).block_of)["total_gb"] == total


@pytest.mark.parametrize("ema", [False, True])
def test_a_checkpoints_bytes_are_estimated_within_five_percent_of_the_file(tmp_path, ema):
    config = TrainConfig(resolution=32, filters=8, widths="0.25,1,2,4,8,8", ema=ema, keep=3)
    model = new_model(config.spec, 1e-3, ema=ema)
    model.optimizer.build(model.trainable_variables)
    model.save(tmp_path / "epoch_1.keras")
    real = (tmp_path / "epoch_1.keras").stat().st_size
    assert abs(checkpoint_bytes(model) - real) < 0.05 * real, (checkpoint_bytes(model), real)
    cost = model_cost(model, config)
    assert cost["disk_mb"] == pytest.approx(4 * cost["checkpoint_mb"], abs=0.3)  # 3 kept and best.keras
    assert cost["parameters"] == model.count_params() and cost["policy"] == "float32"


@pytest.mark.slow
def test_the_script_prints_one_json_line_for_the_training_flags():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "model_cost.py"), "--preset", "v2",
                             "--resolution", "32", "--filters", "4"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    cost = json.loads(lines[0])
    assert (cost["arch"], cost["widths"], cost["policy"], cost["batch_size"]) == (
        "generator", "1,2,4,8,8,8", "mixed_float16", 2)
    assert cost["gmac_per_sample"] == pytest.approx(sum(cost["gmac_by_edge"].values()), abs=0.01)
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "model_cost.py"), "--widths", "1,2"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "Invalid `widths`. Expected 6 positive numbers" in bad.stderr
    assert "Traceback" not in bad.stderr
