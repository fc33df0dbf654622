"""The skip markers for what this machine may lack: the real OpenKBP sample, and TensorFlow's
float16 convolutions under an emulated instruction-set cap."""

from __future__ import annotations

import os

import pytest

from provided_code.infra.environment import cpu_flags
from tests.kit.repo import SAMPLE_DIR

requires_sample = pytest.mark.skipif(
    not (SAMPLE_DIR / "train-pats").is_dir(),
    reason=f"real OpenKBP sample not found at {SAMPLE_DIR} (a fresh clone without ../shared); "
           "the phantom tests cover the same code paths",
)


def _float16_convolutions_unavailable() -> str | None:
    """Why TensorFlow's float16 convolutions fail in this process, or None (they run).

    TensorFlow sends float16 convolutions to oneDNN when the processor's CPUID shows AVX512-FP16 or
    AMX-FP16 (with AVX512BW) or AVX-NE-CONVERT (``IsDataTypeSupportedByOneDNNOnThisCPU``), else to
    its own kernels. ``ONEDNN_MAX_CPU_ISA=AVX2``, set on such a processor to try the suite as an
    AVX2-only machine would run it, caps oneDNN below those instructions while CPUID still shows
    them: oneDNN then has no float16 convolution ("could not create a primitive descriptor"). A real
    AVX2-only processor runs these tests with TensorFlow's own float16 kernels.
    """
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if not cap or cap == "ALL" or "FP16" in cap or "AMX" in cap or "AVX10" in cap or cap == "AVX2_VNNI_2":
        return None
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").lower() in ("0", "false"):
        return None
    flags = set(cpu_flags())
    if ("avx512bw" in flags and flags & {"avx512_fp16", "amx_fp16"}) or "avx_ne_convert" in flags:
        return (f"ONEDNN_MAX_CPU_ISA={cap} on a processor whose CPUID shows float16 instructions: TensorFlow "
                f"sends float16 convolutions to oneDNN, which the cap leaves without them (an emulation "
                f"artefact; a real {cap} processor runs this test on TensorFlow's own kernels)")
    return None


_FLOAT16_UNAVAILABLE = _float16_convolutions_unavailable()
requires_float16_convolutions = pytest.mark.skipif(_FLOAT16_UNAVAILABLE is not None, reason=str(_FLOAT16_UNAVAILABLE))
