"""The demo: write synthetic phantoms, train a small model, predict and score the held-out ones.

    python -m provided_code.apps.demo        (or: bash scripts/demo)
    python -m provided_code.apps.demo --site prostate

Everything lands under ``<results-dir>/``: the phantoms in ``demo-data/`` (``demo-data-<site>/``
for another site than OpenKBP), the model, log, predictions, scores and plots in ``demo/``
(``demo-<site>/``). Nothing is downloaded. The prostate phantoms of every fourth patient have a
plan of their own (``beams.csv``: seven fields; ``prescriptions.csv``), the others the site's arcs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from provided_code.apps.console import click_progress, setup_logging
from provided_code.data_folder import split_dir, split_folder_name
from provided_code.config import TrainConfig
from provided_code.data.resample import RESOLUTIONS
from provided_code.model_spec import ARCHS
from provided_code.errors import UserError
from provided_code.run_folder import RunFolder

DEFAULTS = TrainConfig()
LEARNED_SHARE = 0.5  # a dose score under this share of zero dose's: the model learned


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--results-dir", default="results", help="Where demo-data/ and demo/ go.")
@click.option("--train-patients", type=int, default=10, help="Synthetic training patients.")
@click.option("--validation-patients", type=int, default=3, help="Synthetic held-out patients.")
@click.option("--epochs", type=int, default=20, help="Training epochs (the residual U-Net's 20 cost what the generator's 60 did).")
@click.option("--filters", type=int, default=8, help="Base filters of the U-Net.")
@click.option("--arch", type=click.Choice(ARCHS), default=DEFAULTS.arch, help="The network's body (runpod_train.py's --arch).")
@click.option("--learning-rate", type=float, default=2e-3, help="Adam learning rate (above runpod_train.py's default: few epochs).")
@click.option("--resolution", type=click.Choice([str(r) for r in RESOLUTIONS]), default="32",
              help="Training resolution.")
@click.option("--site", "site_spec", default="openkbp",
              help="The treatment site of the phantoms and the model: openkbp (head and neck) or prostate "
                   "(or a site file with the structures of one of them).")
def main(results_dir, train_patients, validation_patients, epochs, filters, arch, learning_rate, resolution, site_spec):
    """Run the whole pipeline on synthetic phantoms and print where everything landed."""
    setup_logging()
    from provided_code.data.phantoms import missing_numbered_phantoms, write_numbered_phantom
    from provided_code.sites import load_site, openkbp

    try:
        site = load_site(site_spec)
        is_openkbp = site.same_as(openkbp())
        results = Path(results_dir)
        data = results / ("demo-data" if is_openkbp else f"demo-data-{site.name}")
        for split, missing in missing_numbered_phantoms(data, train_patients, validation_patients).items():
            for folder in click_progress(missing, len(missing), f"Writing {split_folder_name(split)} phantoms"):
                write_numbered_phantom(folder, site)
    except UserError as error:
        raise click.ClickException(str(error)) from None

    from provided_code.plots import has_matplotlib
    from provided_code.apps.predict import predict_stage
    from provided_code.training.train import train

    model_name = "demo" if is_openkbp else f"demo-{site.name}"
    model_dir = results / model_name
    if model_dir.exists():
        click.echo(f"Removing the previous demo model {model_dir}")
        shutil.rmtree(model_dir)
    config = TrainConfig(model_name=model_name, data_dir=str(data), results_dir=str(results), arch=arch, filters=filters,
                         resolution=int(resolution), epochs=epochs, learning_rate=learning_rate,
                         save_every=max(1, epochs // 2), site=site)
    click.echo(f"Training a {resolution}³ U-Net ({filters} filters) for {epochs} epochs on {train_patients} "
               f"{site.name} phantoms")
    train(config, progress=click_progress, verbose=0)
    plots = has_matplotlib()
    report = predict_stage(config.run_dir, config.data_dir, stage="validation", epoch="best", plots=plots,
                           progress=click_progress, batch_size=config.batch_size, cache_dir=config.cache_dir)
    zero_score = _zero_prediction_dose_score(config)

    click.echo("")
    click.echo(f"Phantoms:     {data}/ (train-pats/, validation-pats/)")
    folder = RunFolder(config.run_dir)
    click.echo(f"Model:        {folder.models}/ (checkpoints, config.json; best.keras, epoch {report.epoch}, "
               f"predicted with)")
    click.echo(f"Training log: {folder.log}" + (f" (curves: {folder.curves})" if plots else ""))
    click.echo(f"Predictions:  {report.predictions_dir}/")
    click.echo(f"Submission:   {report.submission}")
    click.echo(f"Scores:       {report.scores_path} (per patient: {report.scores_path.with_suffix('.csv')})")
    click.echo(f"Plots:        {folder.plots('validation')}/" if plots
               else "Plots:        skipped (pip install matplotlib to get them)")
    click.echo(f"For scale: predicting zero dose everywhere scores a dose score of {zero_score:.3f} Gy.")
    click.echo(f"dose score {report.scores.dose_score:.3f} Gy, DVH score {report.scores.dvh_score:.3f} Gy "
               f"on {report.patients} held-out phantom{'' if report.patients == 1 else 's'}"
               + learned_warning(report.scores.dose_score, zero_score, epochs))


def learned_warning(dose_score: float, zero_score: float, epochs: int) -> str:
    """The end of the demo's last line when the model has not learned: a dose score not below half
    of zero dose's (what a model that learned the phantoms' doses reaches in the demo's epochs)."""
    if dose_score < LEARNED_SHARE * zero_score:
        return ""
    said = ("has not learned: its dose score is no better than predicting zero dose everywhere"
            if dose_score >= zero_score else
            f"has hardly learned: its dose score is more than {LEARNED_SHARE:g} × predicting zero dose everywhere's")
    return (f"; WARNING: the model {said} ({zero_score:.3f} Gy) after {epochs} epochs (try more --epochs or "
            f"another --learning-rate)")


def _zero_prediction_dose_score(config) -> float:
    import numpy as np

    from provided_code.data.cache import load_split
    from provided_code.metrics.scoring import score_split

    arrays = load_split(split_dir(config.data_dir, "validation"), cache_dir=config.cache_dir, site=config.site)
    return score_split(arrays, lambda row: np.zeros(arrays.dose[row].size)).dose_score


if __name__ == "__main__":
    main()
