"""Per-patient pictures: DVH curves and orthogonal dose slices (needs the optional matplotlib)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from provided_code.data.csv_io import exact_dose
from provided_code.errors import ConfigError
from provided_code.infra.atomic import atomic_path
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


def plot_patient(folder: Path, patient_id: str, arrays, row: int, predicted: np.ndarray,
                 stem: str | None = None) -> list[Path]:
    """Write ``<stem>_dvh.png`` and ``<stem>_slices.png`` into ``folder`` (``stem``: the patient id
    unless given); return their paths.

    The slices show dose as a colour wash over the CT in grey with the target contours drawn, as
    planning systems do, through the centre of the highest target; the third column is the
    difference, predicted − reference. A patient without a reference dose gets the prediction alone.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.lines
    import matplotlib.pyplot as plt

    stem = stem or patient_id
    has_reference = bool(arrays.has_dose[row])
    reference = (exact_dose(arrays.dose[row], int(arrays.dose_decimals[row])).reshape(predicted.shape)
                 if has_reference else None)
    site = arrays.site
    indices = structure_indices(arrays.structure_masks[row], len(site.names))
    # the highest prescription first
    targets = sorted(site.targets, key=lambda t: -site.prescriptions_gy[t])
    top = max(float(reference.max()) if has_reference else 0.0, float(predicted.max()), 1.0)
    bins = np.linspace(0, top * 1.02, 200)

    figure, axes = plt.subplots(figsize=(8, 5))
    colours = plt.get_cmap("tab10")
    for k, (name, voxels) in enumerate(zip(site.names, indices)):
        if voxels.size == 0:
            continue
        for dose, style in ((reference, "-"), (predicted, "--")) if has_reference else ((predicted, "-"),):
            values = np.sort(dose.reshape(-1)[voxels])
            volume = 100.0 * (1.0 - np.searchsorted(values, bins, side="left") / values.size)
            axes.plot(bins, volume, style, color=colours(k), label=name if style == "-" else None)
    axes.set_xlabel("Dose (Gy)")
    axes.set_ylabel("Volume (%)")
    axes.set_title(f"{patient_id}: DVH, " + ("reference (solid) and predicted (dashed)" if has_reference else "predicted"))
    axes.legend(fontsize=7, ncol=2)
    dvh_path = Path(folder) / f"{stem}_dvh.png"
    _save(figure, dvh_path)
    plt.close(figure)

    centre_voxels = next((indices[site.names.index(t)] for t in targets if indices[site.names.index(t)].size), None)
    if centre_voxels is None:
        hottest = reference if has_reference else predicted
        centre = np.unravel_index(int(np.argmax(hottest)), hottest.shape)
    else:
        centre = np.round(np.mean(np.unravel_index(centre_voxels, predicted.shape), axis=1)).astype(int)
    ct = arrays.ct[row].reshape(predicted.shape).astype(np.float32)
    masks = arrays.structure_masks[row].reshape(predicted.shape)
    views = (("axial", 2), ("coronal", 0), ("sagittal", 1))  # axis 2 superior-inferior, 0 AP, 1 LR
    # by prescription, highest first (OpenKBP: PTV70 magenta, PTV63 yellow, PTV56 cyan)
    target_colours = dict(zip(targets, ("magenta", "yellow", "cyan", "lime", "orange", "white", "red", "blue")))
    ct_top = max(float(ct.max()), 1.0)
    columns = ((reference, "reference"), (predicted, "predicted")) if has_reference else ((predicted, "predicted"),)
    error = predicted - reference if has_reference else None
    figure, grid = plt.subplots(3, 3 if has_reference else 1, figsize=(11, 10) if has_reference else (4.5, 10),
                                squeeze=False)
    for r, (view, axis) in enumerate(views):
        def plane(volume):
            image = np.take(volume, centre[axis], axis=axis)
            return image if axis == 2 else image.T  # coronal and sagittal: superior at the top
        ct_plane = plane(ct)
        mask_plane = plane(masks)
        for c, (dose, title) in enumerate(columns):
            axes = grid[r, c]
            axes.imshow(ct_plane, cmap="gray", vmin=0, vmax=ct_top)
            wash = np.ma.masked_less(plane(dose), 0.05 * top)  # no colour where there is (almost) no dose
            image = axes.imshow(wash, cmap="jet", alpha=0.45, vmin=0, vmax=top)
            for target in reversed(targets):
                contour = (mask_plane >> site.names.index(target)) & 1
                if contour.any():
                    axes.contour(contour, levels=[0.5], colors=target_colours.get(target, "white"), linewidths=0.8)
            axes.set_title(f"{view}: {title}", fontsize=9)
            axes.axis("off")
            figure.colorbar(image, ax=axes, fraction=0.046, label="Gy")
        if error is None:
            continue
        difference = plane(error)
        limit = max(float(np.abs(difference).max()), 1e-6)
        image = grid[r, 2].imshow(difference, cmap="RdBu_r", vmin=-limit, vmax=limit)
        grid[r, 2].set_title(f"{view}: predicted − reference", fontsize=9)
        grid[r, 2].axis("off")
        figure.colorbar(image, ax=grid[r, 2], fraction=0.046, label="Gy")
    handles = [matplotlib.lines.Line2D([], [], color=colour, label=name) for name, colour in target_colours.items()]
    figure.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, title="target contours")
    slices_path = Path(folder) / f"{stem}_slices.png"
    _save(figure, slices_path)
    plt.close(figure)
    return [dvh_path, slices_path]


def plot_training_curves(rows: list[dict[str, str]], path: Path, best_epoch: int | None = None) -> Path:
    """``training_curves.png``: loss and validation loss, and the validation dose and DVH scores,
    against epoch, from the rows of ``training_log.csv``; the best epoch marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(name):
        points = [(int(row["epoch"]), float(row[name])) for row in rows if row.get(name) not in (None, "")]
        return [p[0] for p in points], [p[1] for p in points]

    figure, (losses, scores) = plt.subplots(1, 2, figsize=(11, 4))
    for name, label in (("loss", "training loss"), ("val_loss", "validation loss")):
        epochs, values = series(name)
        if epochs:
            losses.plot(epochs, values, label=label)
    losses.set_xlabel("epoch")
    losses.set_ylabel("loss (Gy)")
    losses.legend()
    for name, label, marker in (("val_dose_score", "dose score", "o"), ("val_dvh_score", "DVH score", "s")):
        epochs, values = series(name)
        if epochs:
            scores.plot(epochs, values, marker=marker, label=f"validation {label}")
    scores.set_xlabel("epoch")
    scores.set_ylabel("score (Gy, lower is better)")
    for axes in (losses, scores):
        if best_epoch is not None:
            axes.axvline(best_epoch, color="grey", linestyle="--", label="best (best.keras)" if axes is scores else None)
    scores.legend()
    _save(figure, Path(path))
    plt.close(figure)
    return Path(path)
