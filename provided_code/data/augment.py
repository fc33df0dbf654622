"""Training augmentation, drawn on the host and applied on the device (pure numpy here).

Three moves, applied in this order, the same to ``ct``, ``structure_masks``,
``possible_dose_mask`` and ``dose``:

- ``flip``: mirror left-right (axis 1); the bits of each of the site's mirror pairs (OpenKBP:
  RightParotid and LeftParotid) are swapped, and per-patient gantry angles g become -g;
- ``rotate``: rotate the axial plane (axes 0 and 1, about the superior-inferior axis 2) by
  k × 40°, k = 0 … 8, the spacing of the nine beams of every OpenKBP plan; nearest neighbour, so
  every value is one of the input's; zero where the source falls outside the volume; per-patient
  gantry angles g become g - k × 40°;
- ``shift``: translate by up to ``max_shift(resolution)`` voxels along each axis (±20 at 128³),
  limited so that the whole possible-dose mask stays inside the volume.

The host turns a draw into an index map and a shift, which the device applies
(``tf_augment.apply_geometry``): ``plane_source`` ``(patients, R*R)`` gives, for every voxel of
the output axial plane, the flat index of its source in the input plane (-1: zero);
``slice_shift`` ``(patients,)`` the translation along axis 2 (zero-filled); ``mirrored``
``(patients,)`` says whose mirror pairs' bits to swap (and angles to negate); ``turn_degrees``
``(patients,)`` the turn, for per-patient angles. Each draw depends only on
``(seed, epoch, update index)`` and the patient's place in the update.
"""

from __future__ import annotations

import numpy as np

AUGMENTATIONS = ("flip", "rotate", "shift")
ROTATION_STEP_DEGREES = 40
ROTATIONS = 360 // ROTATION_STEP_DEGREES  # 9
MAX_SHIFT_AT_128 = 20
_DRAW_TAG = 0x6175  # keeps augmentation draws apart from the epoch's shuffle, which uses (seed, epoch)


def parse_augment(text: str) -> tuple[str, ...]:
    """``"none"`` → ``()``; ``"flip,rotate,shift"`` → the names, in canonical order."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return ()
    names = [name.strip().lower() for name in str(text).split(",") if name.strip()]
    unknown = [name for name in names if name not in AUGMENTATIONS]
    if unknown or not names:
        raise ValueError(f"Invalid `augment`. Expected 'none' or a comma list of {', '.join(AUGMENTATIONS)}. "
                         f"Received: augment={text!r}")
    return tuple(name for name in AUGMENTATIONS if name in names)


def max_shift(resolution: int) -> int:
    """The largest translation in voxels: ±20 at 128³, scaled with the resolution."""
    return int(round(MAX_SHIFT_AT_128 * resolution / 128))


def plane_sources(resolution: int, rotation: int, mirrored: bool, shift: tuple[int, int] = (0, 0)) -> np.ndarray:
    """Flat source index in the input axial plane of every output plane voxel (-1 outside), ``(R*R,)`` int32.

    The output is the input mirrored (if ``mirrored``), then rotated by ``rotation`` × 40° about
    the plane's centre, then translated by ``shift`` voxels along axes 0 and 1.
    """
    size = resolution
    i, j = np.meshgrid(np.arange(size, dtype=np.float64), np.arange(size, dtype=np.float64), indexing="ij")
    centre = (size - 1) / 2.0
    a = i - shift[0] - centre  # undo the translation, relative to the centre
    b = j - shift[1] - centre
    angle = np.deg2rad(ROTATION_STEP_DEGREES * rotation)
    cos, sin = (1.0, 0.0) if rotation % ROTATIONS == 0 else (np.cos(angle), np.sin(angle))
    source_i = np.rint(centre + cos * a + sin * b).astype(np.int64)  # undo the rotation
    source_j = np.rint(centre - sin * a + cos * b).astype(np.int64)
    if mirrored:
        source_j = size - 1 - source_j
    inside = (source_i >= 0) & (source_i < size) & (source_j >= 0) & (source_j < size)
    return np.where(inside, source_i * size + source_j, -1).reshape(-1).astype(np.int32)


def _extent(occupied: np.ndarray) -> tuple[int, int] | None:
    found = np.flatnonzero(occupied)
    return (int(found[0]), int(found[-1])) if found.size else None


def _allowed(extent: tuple[int, int] | None, size: int, limit: int) -> tuple[int, int]:
    """The translations in [-limit, limit] that keep ``extent`` inside ``[0, size)``."""
    if extent is None:
        return 0, 0
    return max(-limit, -extent[0]), min(limit, size - 1 - extent[1])


class Augmenter:
    """Draws for the patients of one update, as index maps for ``tf_augment.apply_geometry``.

    ``possible_dose_mask``: the split's masks ``(N, R, R, R)`` (in memory, or memory-mapped); only
    their projections are kept, each made when a shift is first drawn for its patient.
    """

    def __init__(self, augmentations: tuple[str, ...], possible_dose_mask: np.ndarray, seed: int):
        unknown = [name for name in augmentations if name not in AUGMENTATIONS]
        if unknown:
            raise ValueError(f"Invalid `augmentations`. Expected names from {AUGMENTATIONS}. "
                             f"Received: augmentations={augmentations!r}")
        self.augmentations = tuple(augmentations)
        self.seed = seed
        self.resolution = possible_dose_mask.shape[1]
        self.limit = max_shift(self.resolution) if "shift" in self.augmentations else 0
        self._possible_dose_mask = possible_dose_mask
        self._projections: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # row -> (R*R,) plane, (R,) slices
        self._turns = {(rotation, mirrored): plane_sources(self.resolution, rotation, mirrored)
                       for rotation in range(ROTATIONS) for mirrored in (False, True)}

    def _projection(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """The patient's possible-dose mask seen along axis 2 ``(R*R,)`` and across the plane ``(R,)``."""
        if row not in self._projections:
            mask = self._possible_dose_mask[row]
            self._projections[row] = (mask.any(axis=2).reshape(-1), mask.any(axis=(0, 1)))
        return self._projections[row]

    def draw(self, rows: np.ndarray, epoch: int, index: int, needed: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """``plane_source``, ``slice_shift``, ``mirrored`` and ``turn_degrees`` for the patients
        ``rows`` (flat) of update ``index`` of epoch ``epoch``. ``needed`` (bool, like ``rows``): the patients whose
        draws the caller uses (a worker: its own replicas'); the others' shifts are left at 0, so
        that their masks are never read. Every patient's draws are drawn, whatever is needed."""
        rows = np.asarray(rows).reshape(-1)
        needed = np.ones(len(rows), bool) if needed is None else np.asarray(needed, bool).reshape(-1)
        count, size = len(rows), self.resolution
        rng = np.random.default_rng([self.seed, epoch, index, _DRAW_TAG])
        flips = rng.integers(0, 2, count).astype(bool)  # always drawn in the same order, whatever is enabled
        turns = rng.integers(0, ROTATIONS, count)
        fractions = rng.random((count, 3))
        if "flip" not in self.augmentations:
            flips[:] = False
        if "rotate" not in self.augmentations:
            turns[:] = 0
        plane = np.empty((count, size * size), np.int32)
        slices = np.zeros(count, np.int32)
        for n, row in enumerate(rows):
            turned = self._turns[int(turns[n]), bool(flips[n])]
            shift = [0, 0, 0]
            if self.limit and needed[n]:
                # The mask's extent after the flip and rotation, along each axis.
                plane_mask, slice_mask = self._projection(int(row))
                occupied = np.zeros(size * size, bool)
                inside = turned >= 0
                occupied[inside] = plane_mask[turned[inside]]
                occupied = occupied.reshape(size, size)
                extents = (_extent(occupied.any(axis=1)), _extent(occupied.any(axis=0)), _extent(slice_mask))
                for axis, extent in enumerate(extents):
                    low, high = _allowed(extent, size, self.limit)
                    shift[axis] = low + int(fractions[n, axis] * (high - low + 1))
            plane[n] = turned if shift[:2] == [0, 0] else plane_sources(size, int(turns[n]), bool(flips[n]), shift[:2])
            slices[n] = shift[2]
        return {"plane_source": plane, "slice_shift": slices, "mirrored": flips,
                "turn_degrees": (turns * ROTATION_STEP_DEGREES).astype(np.float32)}
