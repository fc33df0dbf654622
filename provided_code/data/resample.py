"""Reduced resolution for small hardware: 128³ → 64³ or 32³ and back.

Down: CT and dose by block mean, masks by block max (for the packed ``structure_masks`` bitfield
that is a bitwise OR over the block). Up (predictions only): separable linear interpolation back
to 128³, then zero outside the possible-dose mask.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from provided_code.constants import VOLUME_SHAPE

RESOLUTIONS = (128, 64, 32)


def check_resolution(resolution: int) -> int:
    if resolution not in RESOLUTIONS:
        raise ValueError(f"Invalid `resolution`. Expected one of {RESOLUTIONS}. Received: resolution={resolution}")
    return VOLUME_SHAPE[0] // resolution


def _blocks(volume: np.ndarray, factor: int) -> np.ndarray:
    """View (..., R*f, R*f, R*f) as (..., R, f, R, f, R, f)."""
    *lead, a, b, c = volume.shape
    return volume.reshape(*lead, a // factor, factor, b // factor, factor, c // factor, factor)


def block_mean(volume: np.ndarray, factor: int) -> np.ndarray:
    """Mean over f³ blocks of the last three axes, as float32."""
    if factor == 1:
        return volume.astype(np.float32, copy=False)
    return _blocks(volume, factor).mean(axis=(-5, -3, -1), dtype=np.float32)


def block_or(volume: np.ndarray, factor: int) -> np.ndarray:
    """Bitwise OR (for bool: any) over f³ blocks of the last three axes."""
    if factor == 1:
        return volume
    blocks = _blocks(volume, factor)
    return np.bitwise_or.reduce(np.bitwise_or.reduce(np.bitwise_or.reduce(blocks, -1), -2), -3)


def downsample_patient(ct: np.ndarray, structure_masks: np.ndarray, possible_dose_mask: np.ndarray,
                       dose: np.ndarray, factor: int) -> dict[str, np.ndarray]:
    """One patient's four volumes reduced by ``factor`` (as floats for CT and dose: the caller
    stores them in its dtypes). In memory (:func:`downsample_split`) and in a memory-mapped
    cohort's file (:func:`provided_code.data.mapped.downsampled`) alike."""
    return {"ct": np.rint(block_mean(ct, factor)), "structure_masks": block_or(structure_masks, factor),
            "possible_dose_mask": block_or(possible_dose_mask, factor), "dose": block_mean(dose, factor)}


def downsample_split(arrays, resolution: int):
    """A :class:`~provided_code.data.split_arrays.SplitArrays` at ``resolution``³ (patient by patient)."""
    factor = check_resolution(resolution)
    if factor == 1:
        return arrays
    shape = (len(arrays), resolution, resolution, resolution)
    volumes = {"ct": np.empty(shape, np.uint16), "structure_masks": np.empty(shape, arrays.structure_masks.dtype),
               "possible_dose_mask": np.empty(shape, bool), "dose": np.empty(shape, np.float32)}
    for i in range(len(arrays)):
        low = downsample_patient(arrays.ct[i], arrays.structure_masks[i], arrays.possible_dose_mask[i],
                                 arrays.dose[i], factor)
        for name, volume in volumes.items():
            volume[i] = low[name]
    return dataclasses.replace(arrays, **volumes)


def sample_centres(source: int, target: int) -> np.ndarray:
    """Where the centres of ``target`` samples fall among ``source`` samples spanning the same
    field of view, in fractional source indices (source sample i's centre is at i)."""
    return (np.arange(target) + 0.5) * (source / target) - 0.5


def linear_taps(positions: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear interpolation at fractional indices ``positions`` along an axis of ``size`` samples
    (beyond the outermost samples, the edge value): ``(low, high, fraction)``, the value at each
    position being ``(1 - fraction) × v[low] + fraction × v[high]``. Resampling here, and between
    the DICOM grids (:mod:`provided_code.dicom.grid`), take their weights from this one function."""
    positions = np.clip(positions, 0, size - 1)
    low = np.floor(positions).astype(np.int64)
    high = np.minimum(low + 1, size - 1)
    return low, high, positions - low


def _linear_along(volume: np.ndarray, axis: int, factor: int) -> np.ndarray:
    """Upsample one axis by ``factor``, sampling at the centres of the fine voxels."""
    size = volume.shape[axis]
    low, high, fraction = linear_taps(sample_centres(size, size * factor), size)
    shape = [1] * volume.ndim
    shape[axis] = -1
    weight = fraction.astype(np.float32).reshape(shape)
    return np.take(volume, low, axis=axis) * (1 - weight) + np.take(volume, high, axis=axis) * weight


def upsample_dose(dose: np.ndarray, possible_dose_mask: np.ndarray) -> np.ndarray:
    """A (R, R, R) dose back to 128³ by linear interpolation, zero outside the 128³ mask."""
    factor = VOLUME_SHAPE[0] // dose.shape[0]
    result = dose.astype(np.float32)
    if factor > 1:
        for axis in range(3):
            result = _linear_along(result, axis, factor)
    return np.where(possible_dose_mask, result, np.float32(0)).astype(np.float32)
