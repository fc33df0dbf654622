"""TensorFlow's process-wide settings that must be made before it is imported.

TensorFlow turns its oneDNN CPU kernels on by default only on processors with the neural-network
instructions it looks for (AVX512-VNNI class); elsewhere its own CPU kernels measured 34-58 times
slower on this network. Every entry point (CLI, demo, tests, benchmarks) calls
:func:`configure_tensorflow` before importing TensorFlow, so CPU runs use oneDNN unless the user
chose otherwise by setting ``TF_ENABLE_ONEDNN_OPTS`` themselves.

On a Linux machine with no GPU at all, TensorFlow's CUDA build still asks the CUDA driver for one
and logs, at error level, "failed call to cuInit: ... UNKNOWN ERROR (303)" on every command that
loads it; with no GPU device file and no GPU driver loaded, :func:`configure_tensorflow` enables
its CPU devices alone (``TF_ENABLED_DEVICE_TYPES=CPU``, unless the user set it), so it asks no
driver. A machine with a GPU (NVIDIA's, WSL2's, AMD's) is left as it is.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
DEVICE_TYPES_VARIABLE = "TF_ENABLED_DEVICE_TYPES"  # TensorFlow's device factories to enable (all when unset)
# What a Linux machine with a GPU has: NVIDIA's device files (made by its driver, or at its first use
# by nvidia-modprobe once the driver is loaded), WSL2's GPU, AMD's ROCm.
GPU_SIGNS = ("/dev/nvidia*", "/proc/driver/nvidia", "/dev/dxg", "/dev/kfd")
_set_here = False  # whether configure_tensorflow chose the oneDNN setting (rather than the user)


def configure_tensorflow() -> None:
    """Turn oneDNN on unless ``TF_ENABLE_ONEDNN_OPTS`` is set; quiet TensorFlow's C++ start-up lines;
    on a Linux machine without a GPU, enable its CPU devices alone (the module docstring).

    Has effect only before TensorFlow is imported in this process (and in the processes it starts,
    which inherit the environment).
    """
    global _set_here
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if ONEDNN_VARIABLE not in os.environ:
        os.environ[ONEDNN_VARIABLE] = "1"
        _set_here = True
    if DEVICE_TYPES_VARIABLE not in os.environ and not gpu_may_exist():
        os.environ[DEVICE_TYPES_VARIABLE] = "CPU"  # no cuInit asked of a driver that is not there


def gpu_may_exist() -> bool:
    """False on a Linux machine that has no sign of a GPU (:data:`GPU_SIGNS`); True anywhere else
    (another system's GPUs, Apple's Metal among them, are not looked for)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(glob.glob(pattern) for pattern in GPU_SIGNS)


def describe_cpu_kernels() -> str:
    """Which CPU kernels TensorFlow runs with, and why (call after importing TensorFlow)."""
    # TensorFlow has no public call that says whether its oneDNN kernels are on (tf.sysconfig's
    # build info does not); its private probe is what its own tests use. The one private TensorFlow
    # module the package reads; without it, the setting alone is reported.
    try:
        from tensorflow.python.util import _pywrap_util_port

        enabled = bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a TensorFlow without the probe: report the setting only
        enabled = os.environ.get(ONEDNN_VARIABLE, "") in ("1", "true", "True")
    value = os.environ.get(ONEDNN_VARIABLE)
    if value is None:
        why = "TensorFlow's default for this processor"
    elif _set_here:
        why = f"{ONEDNN_VARIABLE}=1 set by provided_code (TensorFlow leaves oneDNN off on some processors)"
    else:
        why = f"{ONEDNN_VARIABLE}={value} as set in the environment"
    return f"CPU kernels: {'oneDNN' if enabled else 'TensorFlow default (oneDNN off)'} ({why})"


def cpu_flags() -> list[str]:
    """The processor's vector and matrix instruction flags (avx*, amx*, fma, *vnni) from
    ``/proc/cpuinfo``, for benchmarks to name the machine; empty where there is no such file."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(flag for flag in flags if flag.startswith(("avx", "amx", "fma")) or "vnni" in flag)
