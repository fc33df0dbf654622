"""Per-patient pictures: DVH curves and orthogonal dose slices (needs the optional matplotlib)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from provided_code.atomic import atomic_path
from provided_code.config import ConfigError
from provided_code.constants import STRUCTURES
from provided_code.data.cache import exact_dose
from provided_code.metrics.scoring import structure_indices


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def require_matplotlib() -> None:
    if not has_matplotlib():
        raise ConfigError("--plots needs matplotlib: pip install 'provided_code[plots]' "
                          "(or pip install matplotlib)")


def _save(figure, path: Path) -> None:
    with atomic_path(path, suffix=".png") as tmp:
        figure.savefig(tmp, format="png", dpi=90, bbox_inches="tight")


def plot_patient(folder: Path, patient_id: str, arrays, row: int, predicted: np.ndarray) -> list[Path]:
    """Write ``<patient>_dvh.png`` and ``<patient>_slices.png`` into ``folder``; return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = exact_dose(arrays.dose[row], int(arrays.dose_decimals[row])).reshape(predicted.shape)
    indices = structure_indices(arrays.structure_masks[row])
    top = max(float(reference.max()), float(predicted.max()), 1.0)
    bins = np.linspace(0, top * 1.02, 200)

    figure, axes = plt.subplots(figsize=(8, 5))
    colours = plt.get_cmap("tab10")
    for k, (name, voxels) in enumerate(zip(STRUCTURES, indices)):
        if voxels.size == 0:
            continue
        for dose, style in ((reference, "-"), (predicted, "--")):
            values = np.sort(dose.reshape(-1)[voxels])
            volume = 100.0 * (1.0 - np.searchsorted(values, bins, side="left") / values.size)
            axes.plot(bins, volume, style, color=colours(k), label=name if style == "-" else None)
    axes.set_xlabel("Dose (Gy)")
    axes.set_ylabel("Volume (%)")
    axes.set_title(f"{patient_id}: DVH, reference (solid) and predicted (dashed)")
    axes.legend(fontsize=7, ncol=2)
    dvh_path = Path(folder) / f"{patient_id}_dvh.png"
    _save(figure, dvh_path)
    plt.close(figure)

    centre_voxels = next((indices[STRUCTURES.index(t)] for t in ("PTV70", "PTV63", "PTV56")
                          if indices[STRUCTURES.index(t)].size), None)
    if centre_voxels is None:
        centre = np.unravel_index(int(np.argmax(reference)), reference.shape)
    else:
        centre = np.round(np.mean(np.unravel_index(centre_voxels, reference.shape), axis=1)).astype(int)
    views = (("axial", 2), ("coronal", 0), ("sagittal", 1))  # axis 2 superior-inferior, 0 AP, 1 LR
    figure, grid = plt.subplots(3, 3, figsize=(10, 10))
    for r, (view, axis) in enumerate(views):
        planes = [np.take(volume, centre[axis], axis=axis) for volume in (reference, predicted, predicted - reference)]
        for c, (plane, title) in enumerate(zip(planes, ("reference", "predicted", "predicted − reference"))):
            limit = max(float(np.abs(planes[2]).max()), 1e-6)
            image = grid[r, c].imshow(plane.T if axis != 2 else plane, cmap="RdBu_r" if c == 2 else "jet",
                                      vmin=-limit if c == 2 else 0, vmax=limit if c == 2 else top)
            grid[r, c].set_title(f"{view}: {title}", fontsize=9)
            grid[r, c].axis("off")
            figure.colorbar(image, ax=grid[r, c], fraction=0.046, label="Gy")
    slices_path = Path(folder) / f"{patient_id}_slices.png"
    _save(figure, slices_path)
    plt.close(figure)
    return [dvh_path, slices_path]
