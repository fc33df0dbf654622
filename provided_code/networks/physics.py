"""The beams' physics as an input channel (``--physics``): per beam, a primary-fluence estimate made
on the device from the CT, the targets and the beams' gantry angles, summed over the beams.

For each beam (IEC gantry angle ``g``, the source in direction ``(-cos g, sin g)`` from the
isocentre in (axis 0, axis 1) index coordinates, as :mod:`provided_code.beams`):

- the volume is resampled (nearest voxel) onto a canvas turned so that axis 1 of the canvas runs
  along the beam, from the source side, and axis 2 across it; the canvas is ``canvas_size(R)``
  voxels a side, so no voxel of the plane falls off it at any angle;
- the CT becomes relative electron density by a piecewise-linear table (``DENSITY_TABLE``, HU →
  density relative to water; the CT as stored is ``HU + CT_HU_OFFSET``);
- the radiological depth of a voxel is the density summed along the beam from the canvas's edge
  (air, density 0, adds nothing: the depth starts at the body surface), half the voxel's own
  included, times the in-plane voxel size (mm);
- the aperture is the targets' beam's-eye projection, widened by ``MARGIN_MM`` and blurred by a
  Gaussian of ``PENUMBRA_SIGMA_MM`` for the penumbra, placed in the plane through the isocentre
  (the targets' centre) perpendicular to the beam, and projected divergently from a source
  ``SAD_MM`` from the isocentre: a voxel at distance ``z`` beyond the isocentre's plane sees the
  aperture at its lateral offsets times ``SAD / (SAD + z)``;
- the fluence is ``aperture × (SAD / (SAD + z))² × (1 - exp(-BUILDUP_PER_MM · depth)) ×
  exp(-MU_PER_MM · depth)``: the inverse square, a build-up to a maximum near 15 mm and the
  attenuation of a 6 MV beam (an effective ``MU_PER_MM``);
- it is resampled back onto the volume's grid.

The channel is the mean of the used beams' fluences, divided by its mean over the targets (1 where
the targets receive the mean; a patient without targets gets 0). Every step is a Keras op on
float32 tensors, with no trainable weight, made after the training step's augmentation has moved
the CT, the structures and (per patient) the angles: a moved patient gets its moved channel.

Pure arithmetic on tensors; the constants are the one home of the model's physics.
"""

from __future__ import annotations

import math

import numpy as np
from keras import ops

from provided_code.constants import CT_HU_OFFSET, VOLUME_SHAPE

SAD_MM = 1000.0  # source to isocentre
MU_PER_MM = 0.0046  # effective linear attenuation of a 6 MV beam in water (0.046 / cm)
BUILDUP_PER_MM = 0.26  # build-up: (1 - exp(-b d)) exp(-mu d) peaks at d = ln((b + mu) / mu) / b = 15.6 mm
MARGIN_MM = 5.0  # the aperture: the targets' projection widened by this (a leaf margin)
PENUMBRA_SIGMA_MM = 3.5  # the aperture's edge blurred by a Gaussian of this standard deviation
# HU -> electron density relative to water, piecewise linear, flat beyond the ends
DENSITY_TABLE = ((-1000.0, 0.0), (0.0, 1.0), (1000.0, 1.55), (3000.0, 2.6))
MAX_TAPS = 4  # the margin and the blur reach at most this many voxels either side
COARSENING = 2  # the channel is computed on a grid this many times coarser per axis, then repeated back: at
#                 the volume's own grid, 64³ took 26 times the 32³ grid's time on one core, more than a
#                 residual U-Net's whole step (docs/performance.md has the step's share)


def canvas_size(resolution: int) -> int:
    """The turned canvas's side: 3/2 of the plane's (more than its diagonal), even."""
    return 2 * ((3 * resolution + 3) // 4)


def electron_density(hu):
    """Relative electron density of ``hu`` (a float tensor), by ``DENSITY_TABLE``."""
    (x0, y0), *rest = DENSITY_TABLE
    density = ops.full_like(hu, y0)
    slope_before = 0.0
    previous = (x0, y0)
    for x1, y1 in rest:
        slope = (y1 - previous[1]) / (x1 - previous[0])
        density = density + (slope - slope_before) * ops.relu(hu - previous[0])
        slope_before, previous = slope, (x1, y1)
    return density - slope_before * ops.relu(hu - previous[0])  # flat beyond the last point


def physics_volume(ct, targets, angles, voxel_mm):
    """``(batch, R, R, S)`` float32: :func:`physics_channel` computed on a grid ``COARSENING``
    times coarser per axis (the CT block-averaged, a block in the targets where any of its voxels
    is) and each coarse voxel repeated back over its block. A volume of fewer than 16 voxels a side
    is computed at its own grid. Arguments as :func:`physics_channel`'s."""
    size = ct.shape[1]
    factor = COARSENING if size >= 16 and size % COARSENING == 0 else 1
    if factor == 1:
        return physics_channel(ct, targets, angles, voxel_mm)
    ct = ops.average_pool(ops.cast(ct, "float32")[..., None], factor, strides=factor, padding="valid")[..., 0]
    targets = ops.max_pool(ops.cast(targets, "float32")[..., None], factor, strides=factor, padding="valid")[..., 0]
    coarse = physics_channel(ct, targets, angles, voxel_mm)
    for axis in (1, 2, 3):
        coarse = ops.repeat(coarse, factor, axis=axis)
    return coarse


def physics_channel(ct, targets, angles, voxel_mm):
    """``(batch, R, R, S)`` float32: the beams' mean primary fluence over its mean in the targets.

    ``ct``: the CT as stored (``HU + CT_HU_OFFSET``), ``(batch, R, R, S)``; ``targets``: 0/1,
    the same shape; ``angles``: ``(batch, beams)`` gantry degrees, NaN for an unused slot;
    ``voxel_mm``: ``(batch, 3)`` the voxel size in mm of the 128³ grid (``voxel_dimensions``),
    scaled here to the volume's resolution ``R``. Every beam of every patient is one item of one
    batch of ``batch × beams`` (:func:`beam_fluence`), so the graph holds the arithmetic once.
    """
    ct = ops.cast(ct, "float32")
    targets = ops.cast(targets, "float32")
    angles = ops.cast(angles, "float32")
    size, slices, beams = ct.shape[1], ct.shape[3], angles.shape[1]
    used = ops.isfinite(angles)
    fluence = beam_fluence(ops.repeat(ct, beams, axis=0), ops.repeat(targets, beams, axis=0),
                           ops.reshape(ops.where(used, angles, 0.0), (-1,)),
                           ops.repeat(ops.cast(voxel_mm, "float32"), beams, axis=0))
    fluence = ops.reshape(fluence, (-1, beams, size, size, slices)) * ops.reshape(
        ops.cast(used, "float32"), (-1, beams, 1, 1, 1))
    mean = ops.sum(fluence, axis=1) / ops.reshape(
        ops.maximum(ops.sum(ops.cast(used, "float32"), axis=1), 1.0), (-1, 1, 1, 1))
    in_targets = ops.sum(mean * targets, axis=(1, 2, 3)) / ops.maximum(ops.sum(targets, axis=(1, 2, 3)), 1.0)
    return ops.where(ops.reshape(in_targets, (-1, 1, 1, 1)) > 0,
                     mean / ops.reshape(ops.maximum(in_targets, 1e-6), (-1, 1, 1, 1)), 0.0)


def beam_fluence(ct, targets, angle, voxel_mm):
    """``(items, R, R, S)`` float32: the primary fluence of one beam per item (a patient and one of
    its beams): ``ct`` and ``targets`` ``(items, R, R, S)`` as :func:`physics_channel`'s, ``angle``
    ``(items,)`` gantry degrees, ``voxel_mm`` ``(items, 3)``. An item without targets gets 0."""
    size, slices = ct.shape[1], ct.shape[3]
    canvas = canvas_size(size)
    items = ops.shape(ct)[0]
    voxel_mm = voxel_mm * (VOLUME_SHAPE[0] / size)  # block-averaged volumes have larger voxels
    pitch = (voxel_mm[:, 0] + voxel_mm[:, 1]) / 2.0  # (items,) in-plane mm per voxel
    slice_pitch = voxel_mm[:, 2]

    density = electron_density(ct - CT_HU_OFFSET)
    plane = size * size
    padded = ops.concatenate([ops.reshape(ops.stack([density, targets], axis=-1), (-1, plane, slices, 2)),
                              ops.zeros((items, 1, slices, 2), "float32")], axis=1)  # the last row: outside
    padded = ops.reshape(padded, (-1, slices, 2))  # (items × (plane + 1), slices, 2)
    offsets = ops.reshape(ops.arange(items, dtype="int32"), (-1, 1))

    along, across = np.meshgrid(np.arange(canvas, dtype=np.float32) - canvas / 2,
                                np.arange(canvas, dtype=np.float32) - canvas / 2, indexing="ij")
    along, across = ops.convert_to_tensor(along.reshape(1, -1)), ops.convert_to_tensor(across.reshape(1, -1))
    i_plane, j_plane = np.meshgrid(np.arange(size, dtype=np.float32) - size / 2,
                                   np.arange(size, dtype=np.float32) - size / 2, indexing="ij")
    i_plane, j_plane = ops.convert_to_tensor(i_plane.reshape(1, -1)), ops.convert_to_tensor(j_plane.reshape(1, -1))
    line = ops.convert_to_tensor(np.arange(canvas, dtype=np.float32).reshape(1, -1))  # (1, canvas): a canvas axis
    s_line = ops.convert_to_tensor(np.arange(slices, dtype=np.float32).reshape(1, -1))

    g = angle * (math.pi / 180.0)
    cos_g, sin_g = ops.reshape(ops.cos(g), (-1, 1)), ops.reshape(ops.sin(g), (-1, 1))
    # travel direction (cos g, -sin g), across it (sin g, cos g): ray_bins' "across"
    i = size / 2 + along * cos_g + across * sin_g  # (items, canvas²)
    j = size / 2 - along * sin_g + across * cos_g
    ii, jj = ops.floor(i + 0.5), ops.floor(j + 0.5)
    inside = (ii >= 0) & (ii < size) & (jj >= 0) & (jj < size)
    index = ops.where(inside, ops.cast(ii, "int32") * size + ops.cast(jj, "int32"), plane) + offsets * (plane + 1)
    turned = ops.reshape(ops.take(padded, ops.reshape(index, (-1,)), axis=0), (-1, canvas, canvas, slices, 2))
    dens, targ = turned[..., 0], turned[..., 1]
    depth = (ops.cumsum(dens, axis=1) - 0.5 * dens) * ops.reshape(pitch, (-1, 1, 1, 1))  # mm

    # the isocentre: the targets' centre, in canvas coordinates
    weight = ops.sum(targ, axis=(1, 2, 3))
    has_targets = weight > 0
    weight = ops.maximum(weight, 1e-6)
    m_iso = ops.sum(targ * ops.reshape(line, (1, -1, 1, 1)), axis=(1, 2, 3)) / weight
    n_iso = ops.sum(targ * ops.reshape(line, (1, 1, -1, 1)), axis=(1, 2, 3)) / weight
    s_iso = ops.sum(targ * ops.reshape(s_line, (1, 1, 1, -1)), axis=(1, 2, 3)) / weight

    aperture = ops.max(targ, axis=1)  # (items, canvas across, slices): the beam's-eye projection
    aperture = _widened(aperture, MARGIN_MM / pitch, MARGIN_MM / slice_pitch)
    aperture = _blurred(aperture, PENUMBRA_SIGMA_MM / pitch, PENUMBRA_SIGMA_MM / slice_pitch)

    # divergence: a voxel z mm beyond the isocentre's plane sees the aperture magnified by (SAD + z) / SAD
    z = (line - ops.reshape(m_iso, (-1, 1))) * ops.reshape(pitch, (-1, 1))  # (items, canvas)
    shrink = SAD_MM / ops.maximum(SAD_MM + z, 1.0)
    n_src = ops.reshape(n_iso, (-1, 1, 1)) + (ops.reshape(line, (1, 1, -1)) - ops.reshape(n_iso, (-1, 1, 1))) \
        * shrink[:, :, None]  # (items, along, across)
    s_src = ops.reshape(s_iso, (-1, 1, 1)) + (ops.reshape(s_line, (1, 1, -1)) - ops.reshape(s_iso, (-1, 1, 1))) \
        * shrink[:, :, None]  # (items, along, slices)
    n_src = ops.cast(ops.clip(ops.floor(n_src + 0.5), 0, canvas - 1), "int32")
    s_src = ops.cast(ops.clip(ops.floor(s_src + 0.5), 0, slices - 1), "int32")
    flat = (ops.reshape(offsets, (-1, 1, 1, 1)) * (canvas * slices) + n_src[:, :, :, None] * slices
            + s_src[:, :, None, :])  # (items, along, across, slices)
    seen = ops.reshape(ops.take(ops.reshape(aperture, (-1,)), ops.reshape(flat, (-1,)), axis=0),
                       (-1, canvas, canvas, slices))

    fluence = (seen * ops.reshape(shrink * shrink, (-1, canvas, 1, 1))
               * (1.0 - ops.exp(-BUILDUP_PER_MM * depth)) * ops.exp(-MU_PER_MM * depth))
    fluence = fluence * ops.reshape(ops.cast(has_targets, "float32"), (-1, 1, 1, 1))

    # back onto the plane: each plane voxel's canvas cell
    m_back = ops.floor(i_plane * cos_g - j_plane * sin_g + canvas / 2 + 0.5)
    n_back = ops.floor(i_plane * sin_g + j_plane * cos_g + canvas / 2 + 0.5)
    back = (ops.cast(ops.clip(m_back, 0, canvas - 1), "int32") * canvas
            + ops.cast(ops.clip(n_back, 0, canvas - 1), "int32") + offsets * (canvas * canvas))
    return ops.reshape(ops.take(ops.reshape(fluence, (-1, slices)), ops.reshape(back, (-1,)), axis=0),
                       (-1, size, size, slices))


def _shifted(x, shift: int, axis: int):
    """``x`` moved by ``shift`` voxels along ``axis`` (1 or 2 of a ``(batch, a, b)`` tensor), zeros in."""
    if shift == 0:
        return x
    length = x.shape[axis]
    pad = [(0, 0)] * 3
    pad[axis] = (max(shift, 0), max(-shift, 0))
    padded = ops.pad(x, pad)
    start = max(-shift, 0)
    return padded[:, start:start + length, :] if axis == 1 else padded[:, :, start:start + length]


def _widened(x, reach_across, reach_slices):
    """``x`` ``(batch, across, slices)`` dilated by a per-patient reach in voxels (``(batch,)``,
    rounded, at most ``MAX_TAPS``) along each axis."""
    for axis, reach in ((1, reach_across), (2, reach_slices)):
        reach = ops.reshape(ops.minimum(ops.floor(reach + 0.5), MAX_TAPS), (-1, 1, 1))
        out = x
        for shift in range(1, MAX_TAPS + 1):
            within = ops.cast(reach >= shift, "float32")
            out = ops.maximum(out, within * ops.maximum(_shifted(x, shift, axis), _shifted(x, -shift, axis)))
        x = out
    return x


def _blurred(x, sigma_across, sigma_slices):
    """``x`` ``(batch, across, slices)`` blurred by a Gaussian of a per-patient ``sigma`` in voxels
    along each axis, cut at ``MAX_TAPS`` voxels and normalised."""
    for axis, sigma in ((1, sigma_across), (2, sigma_slices)):
        sigma = ops.reshape(ops.maximum(sigma, 0.1), (-1, 1, 1))
        weights = [ops.exp(-0.5 * (shift / sigma) ** 2) for shift in range(-MAX_TAPS, MAX_TAPS + 1)]
        norm = sum(weights)
        x = sum(w * _shifted(x, shift, axis) for w, shift in zip(weights, range(-MAX_TAPS, MAX_TAPS + 1))) / norm
    return x
