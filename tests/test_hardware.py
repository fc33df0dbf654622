"""The devices, dtype policy and XLA a run resolves (training/hardware.py) and scripts/gpu_check.py,
the check of a rented GPU, run here on the CPU at 32³ as it runs there."""

import json
import subprocess
import sys

import pytest

from provided_code.training.hardware import resolve_precision, resolve_xla
from tests.kit.repo import REPO
from tests.kit.runs import LIGHT_BODY, LIGHT_FLAGS


def test_auto_precision_is_mixed_float16_only_when_every_gpu_has_tensor_cores():
    assert resolve_precision("auto", []) == "float32"
    assert resolve_precision("auto", [(8, 6), (7, 0)]) == "mixed_float16"
    assert resolve_precision("auto", [(8, 6), (6, 1)]) == "float32"
    assert resolve_precision("mixed_bfloat16", []) == "mixed_bfloat16"


def test_auto_xla_is_on_with_a_gpu_and_off_on_a_cpu_and_says_why():
    assert resolve_xla("auto", True) == (True, "--xla auto: a GPU is visible")
    on, reason = resolve_xla("auto", False)
    assert not on and "XLA:CPU is slower than oneDNN" in reason
    assert resolve_xla("on", False)[0] and not resolve_xla("off", True)[0]


@pytest.mark.slow
def test_the_gpu_check_runs_the_training_step_and_reloads_a_checkpoint_on_a_cpu(tmp_path):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), *LIGHT_FLAGS, "--resolution", "32",
                             "--filters", "4", "--steps", "2", "--warmup", "1", "--epochs", "10"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1
    check = json.loads(lines[0])
    assert check["device"].startswith("CPU") and check["gpus"] == 0 and check["tensorflow"]
    assert (check["policy"], check["xla"], check["resolution"], check["epochs"]) == ("float32", False, 32, 10)
    assert check["checkpoint_roundtrip"] is True
    assert 0 < check["device_seconds_per_step"] and 0 < check["seconds_per_step"] < check["compile_s"]
    assert check["samples_per_second"] == pytest.approx(2 / check["seconds_per_step"], rel=0.01)
    assert 0 <= check["input_share"] < 1 and check["peak_memory_mb"] > 0
    assert check["cost"]["gmac_per_sample"] > 0 and check["estimated_hours"] > 0
    verdict = result.stderr.strip().splitlines()[-1]
    assert verdict == check["verdict"] and verdict.startswith("10 epochs of 200 patients at 32³, --filters 4 "
                                                              f"({LIGHT_BODY['arch']}, widths")
    assert "checkpoint saved and reloaded alike" in verdict
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_the_gpu_check_refuses_a_bad_count_in_one_line():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--steps", "0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stderr.strip() == \
        "Error: Invalid `steps`. Expected a whole number >= 1. Received: 0"
