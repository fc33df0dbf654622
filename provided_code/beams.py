"""Beam geometry for the beam input channels (``--beams``): which voxels the rays through the
targets cross, per beam angle. Pure numpy; the network computes the channels on the device from
the tables made here (:class:`provided_code.networks.layers.CompactInputs`).

Angles are IEC gantry angles of a head-first supine patient, in degrees: the source of a beam at
gantry angle g lies in direction ``(-cos g, sin g)`` from the isocentre in (axis 0, axis 1) index
coordinates (axis 0 runs anterior to posterior, axis 1 from the patient's right to left), so 0 is
anterior and 90 the patient's left. The rays are parallel (no divergence) and coplanar: a beam's
voxels in an axial slice are those on the lines, in the beam's direction, that cross a target
voxel of the same slice; the lines are one voxel wide and sample the beam's-eye view at the voxel
pitch (a voxel is on the line of bin ``floor(s + 1/2)``, ``s`` its signed distance across the
beam in voxels from the plane's centre).
"""

from __future__ import annotations

import math

import numpy as np

from provided_code.sites import is_gantry_angle

BEAM_CHANNELS = ("count", "each")
MANY_BEAMS = 36  # more than this (10° apart) is warned about: each beam costs a segment maximum per voxel in
#                  the first layer (1000 beams made a 32³ epoch take 114 s instead of 20), and the
#                  plans this was made for (OpenKBP's nine, a site's five to fifteen) use far fewer


def equidistant_angles(beams: int, phase: float = 0.0) -> tuple[float, ...]:
    """``beams`` gantry angles 360/beams apart starting at ``phase`` (OpenKBP's nine, 40° apart from
    0, are its site's beams: ``load_site("openkbp").beams``)."""
    if beams < 0:
        raise ValueError(f"Invalid `beams`. Expected 0 (off) or a positive number. Received: beams={beams}")
    return tuple(float((phase + k * 360.0 / beams) % 360.0) for k in range(beams))


def parse_beam_angles(text: str) -> tuple[float, ...]:
    """``"0,40,80"`` → ``(0.0, 40.0, 80.0)``: distinct gantry angles in degrees, each in [0, 360) (an
    IEC gantry angle: 360 or 400 is a slip, not 0 or 40)."""
    try:
        angles = tuple(float(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        angles = ()
    if not angles or len(set(angles)) != len(angles) or not all(map(is_gantry_angle, angles)):
        raise ValueError(f"Invalid `beam_angles`. Expected a comma list of distinct gantry angles in degrees, each in "
                         f"[0, 360), e.g. '0,40,80'. Received: beam_angles={text!r}")
    return angles


def resolve_beam_angles(beams: int, beam_angles: str) -> tuple[float, ...]:
    """The gantry angles of ``beam_angles`` (a comma list) if given, else ``beams`` equidistant ones."""
    return parse_beam_angles(beam_angles) if str(beam_angles).strip() else equidistant_angles(beams)


def beam_concerns(angles: tuple[float, ...], resolution: int) -> list[str]:
    """Why ``angles`` may not be what the user meant, at a grid of ``resolution``² voxels per
    axial plane: more than ``MANY_BEAMS`` beams (slow, and no plan of this kind has them), or two
    beams closer than the grid resolves (their lines part by less than one voxel at the plane's
    edge, half the plane from the centre: under ``2 / resolution`` radians), which then make
    nearly the same channel."""
    concerns = []
    if len(angles) > MANY_BEAMS:
        concerns.append(f"{len(angles)} beams: more than {MANY_BEAMS} make the first layer slow (one segment "
                        f"maximum per beam and voxel) for channels that differ little")
    if len(angles) > 1:
        ordered = sorted(a % 360.0 for a in angles)
        closest = min([b - a for a, b in zip(ordered, ordered[1:])] + [ordered[0] + 360.0 - ordered[-1]])
        resolvable = math.degrees(2.0 / resolution)
        if closest < resolvable:
            concerns.append(f"beams {closest:.3g}° apart: closer than a {resolution}³ grid resolves ({resolvable:.2g}°: "
                            f"their lines part by less than one voxel at the edge of the plane), so they make "
                            f"nearly the same channel")
    return concerns


def augmentations_that_move_beams(angles: tuple[float, ...], augmentations: tuple[str, ...],
                                  rotation_step: float) -> list[str]:
    """The augmentations after which run-wide ``angles`` no longer describe the moved patient's
    beams: the channels are made after augmentation with the same angles, which stays true only if
    a left-right flip (gantry g to -g) and a turn by ``rotation_step`` (g to g - step) map the set
    of angles to itself. Shifts never move a direction. (Per-patient angles, ``beam_slots``, are
    turned with the patient and stay true under any augmentation.)"""
    def same(moved):
        return sorted(round(a % 360.0, 6) for a in moved) == sorted(round(a % 360.0, 6) for a in angles)

    broken = []
    if "flip" in augmentations and not same(-a for a in angles):
        broken.append("flip")
    if "rotate" in augmentations and not same(a - rotation_step for a in angles):
        broken.append("rotate")
    return broken


def ray_count(resolution: int) -> int:
    """How many one-voxel-wide lines cover an axial plane of ``resolution``² voxels, any angle."""
    return 2 * (math.ceil(resolution / math.sqrt(2)) + 1) + 1


def ray_bins(resolution: int, angle: float) -> np.ndarray:
    """``(R*R,)`` int32: the line (0 … ``ray_count(R) - 1``) of each voxel of the axial plane
    (flat index ``i * R + j``) for the beam at gantry ``angle`` degrees."""
    g = math.radians(angle)
    i, j = np.meshgrid(np.arange(resolution, dtype=np.float64), np.arange(resolution, dtype=np.float64),
                       indexing="ij")
    a, b = i - resolution / 2, j - resolution / 2
    across = a * math.sin(g) + b * math.cos(g)  # perpendicular to the source direction (-cos g, sin g)
    return (np.floor(across + 0.5) + ray_count(resolution) // 2).astype(np.int32).reshape(-1)


def beam_voxels(targets: np.ndarray, angle: float) -> np.ndarray:
    """``targets`` ``(R, R, slices)`` bool → the voxels on the lines of the beam at ``angle``
    that cross a target voxel of the same slice, ``(R, R, slices)`` bool (numpy, for scripts)."""
    size, _, slices = targets.shape
    bins = ray_bins(size, angle)
    crossed = np.zeros((ray_count(size), slices), bool)
    flat = targets.reshape(size * size, slices)
    np.logical_or.at(crossed, bins, flat)
    return crossed[bins].reshape(size, size, slices)
