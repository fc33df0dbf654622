"""Peak memory per epoch, the figure users size ``--filters``, ``--batch-size`` and ``--recompute`` by.

GPU: TensorFlow's peak allocation on the busiest visible GPU since the epoch began. CPU: the
process's peak resident memory (VmHWM), reset at each epoch's start where Linux allows
(``/proc/self/clear_refs``); elsewhere the peak since the process started.
"""

from __future__ import annotations

import logging
import resource
import sys

import tensorflow as tf

from provided_code.training.loop import EpochMeasure

logger = logging.getLogger(__name__)


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (since the last reset, where resets work)."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


def current_rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError("no VmRSS in /proc/self/status")


class PeakMemory(EpochMeasure):
    """``peak_memory_mb``: the peak over the epoch's training and validation."""

    def __init__(self):
        self.gpus: list[str] = []

    def start(self) -> None:
        self.gpus = [device.name for device in tf.config.list_logical_devices("GPU")]

    def begin_epoch(self, epoch: int) -> None:
        for gpu in self.gpus:
            tf.config.experimental.reset_memory_stats(gpu)
        if not self.gpus:
            reset_peak_rss()

    def measure(self, epoch: int) -> dict:
        if self.gpus:
            peak = max(tf.config.experimental.get_memory_info(gpu)["peak"] for gpu in self.gpus) / 2**20
        else:
            peak = peak_rss_mb()
        return {"peak_memory_mb": round(peak, 1)}
