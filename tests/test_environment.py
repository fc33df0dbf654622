"""TensorFlow's process settings, made before it loads: on a machine without a GPU, no cuInit error."""

import os
import subprocess
import sys

import pytest

from provided_code.infra import environment
from tests.kit.repo import REPO


def test_without_a_gpu_only_the_cpu_devices_are_enabled(tmp_path, monkeypatch):
    monkeypatch.delenv(environment.DEVICE_TYPES_VARIABLE, raising=False)
    monkeypatch.setattr(environment, "GPU_SIGNS", (str(tmp_path / "nvidia*"), str(tmp_path / "dxg")))
    environment.configure_tensorflow()
    assert os.environ[environment.DEVICE_TYPES_VARIABLE] == "CPU"


def test_with_a_gpu_or_the_users_own_setting_the_devices_are_left_alone(tmp_path, monkeypatch):
    monkeypatch.delenv(environment.DEVICE_TYPES_VARIABLE, raising=False)
    (tmp_path / "nvidia0").touch()  # an NVIDIA GPU's device file
    monkeypatch.setattr(environment, "GPU_SIGNS", (str(tmp_path / "nvidia*"), str(tmp_path / "dxg")))
    environment.configure_tensorflow()
    assert environment.DEVICE_TYPES_VARIABLE not in os.environ
    (tmp_path / "nvidia0").unlink()
    monkeypatch.setenv(environment.DEVICE_TYPES_VARIABLE, "CPU,GPU")
    environment.configure_tensorflow()
    assert os.environ[environment.DEVICE_TYPES_VARIABLE] == "CPU,GPU"


@pytest.mark.slow
@pytest.mark.skipif(environment.gpu_may_exist(), reason="this machine may have a GPU: TensorFlow's cuInit is meant to run")
def test_a_command_on_a_machine_without_a_gpu_logs_no_cuinit_error():
    """TensorFlow's CUDA build asks the driver for a GPU on its first device listing; without one it
    logged "failed call to cuInit: ... UNKNOWN ERROR (303)" at error level on every command."""
    probe = ("from provided_code.infra.environment import configure_tensorflow\nconfigure_tensorflow()\n"
             "import tensorflow as tf\nprint('DEVICES', [d.device_type for d in tf.config.list_physical_devices()])\n")
    env = {key: value for key, value in os.environ.items() if key != environment.DEVICE_TYPES_VARIABLE}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                            env={**env, "PYTHONPATH": str(REPO)})
    assert "DEVICES ['CPU']" in result.stdout, result.stderr
    assert "cuInit" not in result.stderr
