"""The training and scoring command lines: ``openkbp-train`` (also ``python runpod_train.py``) and
``openkbp-score``. TensorFlow is imported after parsing."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from click.core import ParameterSource

from provided_code.apps.console import USER_ERRORS, click_progress, one_line, parse_epoch, setup_logging
from provided_code.config import (
    FREEZES,
    LOSSES,
    LR_SCHEDULES,
    NORMS,
    PRECISIONS,
    XLA_MODES,
    TrainConfig,
    check_beam_flags,
)
from provided_code.infra.tf_config import read_tf_config
from provided_code.data.resample import RESOLUTIONS
from provided_code.model_spec import ARCHS, HEADS
from provided_code.data_folder import STAGES, require_split
from provided_code.infra.preflight import check_writable
from provided_code.metrics.calibration import DEFAULT_COVERAGE
from provided_code.beams import BEAM_CHANNELS
from provided_code.presets import PRESETS, apply_preset
from provided_code.run_folder import RunFolder
from provided_code.tolerances import describe as describe_tolerances

DEFAULTS = TrainConfig()
CACHE_DIR_HELP = ("Cache folder [default: $OPENKBP_CACHE_DIR, else $XDG_CACHE_HOME/provided_code, "
                  "else ~/.cache/provided_code].")


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("--site", default="openkbp",
              help="The treatment site: openkbp, prostate, or a site file (docs/sites.md). A resume, "
                   "--predict-only and --ensemble use the model's own.")
@click.option("--arch", type=click.Choice(ARCHS), default=DEFAULTS.arch,
              help="The network's body: generator (the 2020 starter's, no convolution at full resolution), resunet "
                   "(a residual U-Net with a full-resolution stem and head; docs/recipe.md) or plain (resunet's "
                   "layers without the residual additions).")
@click.option("--filters", type=int, default=DEFAULTS.filters, help="Base filters of the U-Net.")
@click.option("--widths", default="", show_default=False,
              help="Features of each of the six stages (128³, 64³, … 4³; the first five at 64³) as multiples of "
                   "--filters, e.g. 0.25,1,2,4,8,8 [default: the body's own, model_spec.BODIES].")
@click.option("--head", type=click.Choice(HEADS), default=None, show_default=False,
              help="The dose head's last activation: softplus (positive with a gradient everywhere: it cannot "
                   "die), relu, or leaky (relu when predicting, a LeakyReLU while training: it cannot die) "
                   "[default: the body's own: softplus, the generator's relu].")
@click.option("--dropout", type=float, default=DEFAULTS.dropout, help="SpatialDropout3D rate (0: none).")
@click.option("--prescription-channel/--no-prescription-channel", default=DEFAULTS.prescription_channel,
              help="One more input channel: each voxel's highest target prescription over the site's highest "
                   "(OpenKBP: 70 Gy).")
@click.option("--norm", type=click.Choice(NORMS), default=DEFAULTS.norm,
              help="Normalisation: batch (synchronised across replicas) or instance (per sample and channel).")
@click.option("--beams", type=int, default=None, show_default=False,
              help="Beam input channels for N equidistant coplanar beams from gantry 0; 0: none [default: the site's "
                   "beams; OpenKBP: 9, at gantry 0, 40, …, 320].")
@click.option("--beam-angles", default="",
              help="The beams' IEC gantry angles instead, a comma list of degrees (head-first supine), "
                   "e.g. 0,51,102,153,204,255,306 for another site's seven beams.")
@click.option("--beam-channels", type=click.Choice(BEAM_CHANNELS), default=DEFAULTS.beam_channels,
              help="count: one channel, how many beams cross each voxel; each: one channel per beam.")
@click.option("--physics/--no-physics", default=DEFAULTS.physics,
              help="One more input channel: the beams' primary fluence (the CT's electron density, depth from the "
                   "body surface, attenuation, inverse square, the targets' aperture with a margin and penumbra), "
                   "made on the device after augmentation; needs beams.")
@click.option("--epochs", type=int, default=DEFAULTS.epochs, help="Total epochs (a resumed run continues to this).")
@click.option("--data-dir", default=DEFAULTS.data_dir, help="Folder holding train-pats/, validation-pats/, test-pats/.")
@click.option("--results-dir", default=DEFAULTS.results_dir, help="Where results/<model-name>/ goes.")
@click.option("--model-name", default=DEFAULTS.model_name, help="Run name: results/<model-name>/.")
@click.option("--batch-size", type=int, default=DEFAULTS.batch_size, help="Patients per step (per device).")
@click.option("--learning-rate", type=float, default=DEFAULTS.learning_rate, help="Adam learning rate.")
@click.option("--lr-schedule", type=click.Choice(LR_SCHEDULES), default=DEFAULTS.lr_schedule,
              help="Learning rate per epoch: constant, or cosine decay from --learning-rate towards 0.")
@click.option("--warmup-epochs", type=int, default=DEFAULTS.warmup_epochs,
              help="Rise linearly to --learning-rate over the first N epochs.")
@click.option("--ema/--no-ema", default=DEFAULTS.ema,
              help="Keep a moving average of the weights; it is what is validated, scored, kept as best.keras "
                   "and predicted with.")
@click.option("--loss", type=click.Choice(LOSSES), default=DEFAULTS.loss,
              help="masked-mae: mean |error| inside the possible-dose mask; mae: over the whole volume.")
@click.option("--dvh-weight", type=float, default=DEFAULTS.dvh_weight,
              help="Add this weight × a DVH term (per structure, the dose's moments predicted against reference) "
                   "to the loss; 0: off.")
@click.option("--augment", default=DEFAULTS.augment,
              help="none, or a comma list of flip (left-right, parotids swapped), rotate (axial, 40° steps), "
                   "shift (up to ±20 voxels at 128³, possible-dose mask kept inside).")
@click.option("--score-every", type=int, default=DEFAULTS.score_every,
              help="Every N epochs and at the last: the challenge's dose and DVH scores on the validation "
                   "patients, and models/best.keras (lowest dose score); 0: never.")
@click.option("--save-every", type=int, default=DEFAULTS.save_every, help="Checkpoint every N epochs (and at the last).")
@click.option("--keep", type=int, default=DEFAULTS.keep, help="Newest checkpoints to keep.")
@click.option("--precision", type=click.Choice(PRECISIONS), default=DEFAULTS.precision,
              help="Dtype policy; auto = mixed_float16 on tensor-core GPUs, float32 on CPU.")
@click.option("--xla", type=click.Choice(XLA_MODES), default=DEFAULTS.xla, is_flag=False, flag_value="on",
              help="XLA-compile each replica's forward and backward; auto = on with a GPU, off on a CPU "
                   "(where it is much slower). A bare --xla means on.")
@click.option("--no-xla", is_flag=True, help="Same as --xla off.")
@click.option("--resolution", type=click.Choice([str(r) for r in RESOLUTIONS]), default=str(DEFAULTS.resolution),
              help="Train at 128³, or block-averaged 64³ / 32³ for small hardware.")
@click.option("--seed", type=int, default=DEFAULTS.seed, help="Seed for weights, dropout and shuffling.")
@click.option("--devices", default=DEFAULTS.devices,
              help="N or 'all': MirroredStrategy over N GPUs; without GPUs, N logical CPU devices (a testing aid).")
@click.option("--multi-worker", is_flag=True,
              help="Train over several machines (MultiWorkerMirroredStrategy from TF_CONFIG; worker 0 is the chief).")
@click.option("--collective-timeout", type=float, default=DEFAULTS.collective_timeout,
              help="With --multi-worker: seconds to wait for the other workers before stopping with an error.")
@click.option("--accumulate", type=int, default=DEFAULTS.accumulate,
              help="Average the gradients of N consecutive batches per update (update = N × global batch).")
@click.option("--recompute", is_flag=True,
              help="Recompute block activations in the backward pass instead of storing them (less memory).")
@click.option("--memory-map", is_flag=True,
              help="Train from the cache file mapped into memory: each batch reads only its patients (for cohorts "
                   "larger than memory; chosen by itself when the arrays would not fit).")
@click.option("--scale-lr", is_flag=True, help="Multiply the learning rate by the number of replicas.")
@click.option("--skip-incomplete", is_flag=True, help="Leave out patients with missing files (and say which).")
@click.option("--tensorboard", is_flag=True, help="Also write TensorBoard events to results/<model-name>/tensorboard/.")
@click.option("--cache-dir", default=None, help=CACHE_DIR_HELP)
@click.option("--start-over", is_flag=True,
              help="Train this model from scratch: its checkpoints, config, log and predictions are moved into "
                   "results/<model-name>/abandoned-<time>/ first (needed when no checkpoint loads).")
@click.option("--change-recipe", is_flag=True,
              help="On a resume: train on with the recipe flags given (loss, augmentation, rate, schedule, seed, "
                   "...) where they differ from the saved ones, recorded in config.json's history; without "
                   "it such a resume is refused.")
@click.option("--folds", type=int, default=DEFAULTS.folds,
              help="N-fold cross-validation over train-pats/ (N >= 2; 0: none): the patients are dealt into N folds "
                   "once (results/<model-name>/splits.json), and each --fold K is a run of its own.")
@click.option("--fold", type=int, default=DEFAULTS.fold,
              help="With --folds: the fold this command trains, 1..N, in results/<model-name>/fold-<K>/: on the other "
                   "folds' patients, validated on its own, then its out-of-fold predictions written.")
@click.option("--exclude", "exclude_file", default=None,
              help="CSV of patient,reason: training patients left out of training (of every fold), recorded with the "
                   "model; a resume with another list needs --change-recipe.")
@click.option("--init-from", default=DEFAULTS.init_from, metavar="MODEL_DIR",
              help="Start a new model from a trained model's weights (its run folder, e.g. results/parent; a "
                   "cross-validated model's: one fold's): the layers of the same name and shapes are taken, the "
                   "network flags not given are the parent's; recorded in config.json. Refused on a resume.")
@click.option("--init-epoch", default=str(DEFAULTS.init_epoch), show_default=True,
              help="With --init-from: the parent's checkpoint, 'best' (models/best.keras) or an epoch. Not given: its "
                   "best where it has one, else its final checkpoint (the log says which).")
@click.option("--freeze", type=click.Choice(FREEZES), default=DEFAULTS.freeze,
              help="encoder: the encoder's weights taken from the parent stay fixed for --freeze-epochs epochs.")
@click.option("--freeze-epochs", type=int, default=DEFAULTS.freeze_epochs,
              help="With --freeze: how many epochs, from the first.")
@click.option("--predict-only", is_flag=True, help="Predict with a trained model instead of training.")
@click.option("--epoch", default=None,
              help="With --predict-only: the checkpoint epoch, or 'best' (models/best.keras) [default: newest].")
@click.option("--stage", type=click.Choice(STAGES), default="validation",
              help="With --predict-only: the split to predict.")
@click.option("--tta", is_flag=True, help="With --predict-only: average over mirror flips.")
@click.option("--ensemble", default=None,
              help="With --predict-only: NAME,NAME,... trained runs in --results-dir (each once), each at --epoch "
                   "[default: best], averaged; outputs go to results/<model-name>/ (not a member's name).")
@click.option("--plots", is_flag=True, help="With --predict-only: DVH and slice PNGs per patient (needs matplotlib).")
@click.option("--band", type=float, default=DEFAULT_COVERAGE, show_default=True,
              help="With --predict-only --ensemble of a commissioned cross-validated model: the nominal coverage of "
                   "each DVH metric's band (0.9: it holds the value a plan achieves 90 % of the time).")
@click.option("--preset", type=click.Choice(tuple(PRESETS)), default=None,
              help="Set every recipe and network choice (loss, augmentation, schedule, normalisation, inputs, DVH "
                   "term, body) to a documented set: starter (the 2020 recipe), v1, v2, default; or, for a small cohort "
                   "started with --init-from, finetune (the recipe only: rate, warm-up, schedule, freezing); flags "
                   "given override it.")
@click.pass_context
def main(ctx, predict_only, epoch, stage, tta, plots, resolution, no_xla, start_over, change_recipe, ensemble, preset,
         band, **options):
    """Train (or, with --predict-only, apply) the OpenKBP dose-prediction U-Net.

    Example: python runpod_train.py --filters 64 --epochs 100
    """
    setup_logging()
    made = []  # the run's folders this command creates: a refused run removes them, left unused
    try:
        if options["exclude_file"] is not None and predict_only:
            raise click.BadParameter("Expected --exclude only when training (the patients left out of training). "
                                     "Received: --exclude with --predict-only, which predicts every patient of the "
                                     "stage", param_hint="--exclude")
        config, given = settings(ctx)
        # TF_CONFIG read once: a bad one fails now, before TensorFlow is imported and the data loaded
        cluster = read_tf_config() if config.multi_worker and not predict_only else None
        epoch = parse_epoch(epoch)
        if change_recipe and predict_only:
            raise click.BadParameter("Expected --change-recipe only when resuming training (it changes a model's "
                                     "recipe from the resumed epoch on). Received: --change-recipe with --predict-only",
                                     param_hint="--change-recipe")
        if "band" in given and not predict_only:
            raise click.BadParameter("Expected --predict-only with --band. Received: --band without it",
                                     param_hint="--band")
        if given & {"init_from", "init_epoch"} and predict_only:
            raise click.BadParameter("Expected --init-from and --init-epoch only when training a new model (its "
                                     "starting weights). Received: --init-from with --predict-only",
                                     param_hint="--init-from")
        if preset == "finetune" and not predict_only and "init_from" not in given:
            click.echo("Warning: --preset finetune without --init-from: its low rate and short warm-up suit a model "
                       "started from a trained one (--init-from MODEL_DIR)", err=True)
        if ensemble is not None and not predict_only:
            raise click.BadParameter("Expected --predict-only with --ensemble. Received: --ensemble without it",
                                     param_hint="--ensemble")
        members = None
        if ensemble is not None:
            members = [name.strip() for name in ensemble.split(",")]
            if not all(members):
                raise click.BadParameter(f"Expected a comma list of trained runs' names, none empty. "
                                         f"Received: {ensemble!r}", param_hint="--ensemble")
        from provided_code.data.cache import default_cache_dir

        made = [path for path in dict.fromkeys((config.run_dir, config.model_dir)) if not path.exists()]
        _check_folders(config, predict_only, stage, default_cache_dir())  # before TensorFlow loads and the data
        if predict_only:
            from provided_code.apps.predict import predict_stage

            report = predict_stage(config.run_dir, config.data_dir, stage=stage, epoch=epoch, tta=tta, plots=plots,
                                   progress=click_progress, ensemble=members, batch_size=config.batch_size,
                                   cache_dir=config.cache_dir, skip_incomplete=config.skip_incomplete,
                                   site=options["site"] if "site" in given else None, band=band)
            click.echo(report.summary())
            return
        from provided_code.training.train import train

        # A progress bar on a terminal; under nohup, tee or a pod's log, one plain line per epoch.
        result = train(config, progress=click_progress, verbose=1 if sys.stdout.isatty() else 0,
                       start_over=start_over, given=given, change_recipe=change_recipe, cluster=cluster)
        held_out = None
        if config.folds and result.is_chief:  # the fold's out-of-fold predictions, once it is trained
            from provided_code.apps.predict import predict_held_out

            held_out = predict_held_out(config.run_dir, config.data_dir, progress=click_progress,
                                        batch_size=config.batch_size, cache_dir=config.cache_dir,
                                        skip_incomplete=config.skip_incomplete)
    except USER_ERRORS as error:
        for path in made:  # the fold's folder first, then the model's
            RunFolder(path).remove_if_unused()
        raise click.ClickException(one_line(error)) from None
    name = RunFolder(config.run_dir).name
    if result.first_epoch >= result.last_epoch:
        click.echo(f"Model {name} is already trained to epoch {result.first_epoch}; nothing to do.")
    else:
        click.echo(f"Trained {name} from epoch {result.first_epoch} to {result.last_epoch} "
                   f"({result.policy} on {result.device}).")
    click.echo(f"Checkpoint: {result.checkpoint}")
    click.echo(f"Log: {RunFolder(config.run_dir).log}")
    if held_out is not None:
        click.echo(held_out.summary())


# The training command's flags that are not a run's settings (TrainConfig's fields)
NOT_SETTINGS = ("predict_only", "epoch", "stage", "tta", "plots", "resolution", "no_xla", "start_over", "change_recipe",
                "ensemble", "preset", "band", "exclude_file")


def settings(ctx: click.Context) -> tuple[TrainConfig, set[str]]:
    """``(config, given)``: the run's settings from the training command's parsed flags (``ctx``:
    this command's context, or ``main.make_context(...)``'s for a script that takes the same flags),
    a ``--preset`` applied to the fields not given and ``--exclude``'s list read; and the fields
    asked for on purpose (the flags given, every field of a preset given): a resume takes the saved
    value of everything else."""
    params = ctx.params
    options = {name: value for name, value in params.items() if name not in NOT_SETTINGS}
    given = {name for name in params if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT}
    if {"beams", "beam_angles"} <= given:
        check_beam_flags(options["beams"], options["beam_angles"])
    preset = params["preset"]
    options = apply_preset(preset, options, given)
    options["init_epoch"] = parse_epoch(options["init_epoch"], "--init-epoch")
    if params["no_xla"]:
        options["xla"] = "off"
    if params["exclude_file"] is not None:
        from provided_code.exclusions import read_exclusions

        options["excluded"] = read_exclusions(params["exclude_file"])
        options["excluded_by"] = {"file": str(Path(params["exclude_file"]).resolve()),
                                  "command": _command_line(ctx, given)}
        given |= {"excluded", "excluded_by"}
    config = TrainConfig(resolution=int(params["resolution"]), **options)
    given |= ({"xla"} if params["no_xla"] else set()) | (set(PRESETS[preset]) if preset is not None else set())
    return config, given


def _command_line(ctx: click.Context, given: set[str]) -> str:
    """The command as given: its name and the flags the user set, with their values (what a
    model's ``config.json`` records of who asked for an exclusion list)."""
    words = [ctx.command_path]
    for param in ctx.command.params:
        if param.name not in given or not param.opts:
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False):
            words.append(param.opts[0] if value else (param.secondary_opts or param.opts)[0])
        else:
            words += [param.opts[0], str(value)]
    return " ".join(words)


def _check_folders(config, predict_only: bool, stage: str, default_cache: Path) -> None:
    """The checks of one run before TensorFlow loads: its data (the training split, or the stage
    predicted), its model's folder (``results/<model-name>``: a missing model is --predict-only's
    own error, with its advice) and its cache folder (the default when not given) can be written."""
    results = "results folder (--results-dir, --model-name)"
    if predict_only:
        require_split(config.data_dir, stage)
        if config.run_dir.is_dir():
            check_writable(config.run_dir, results)
    else:
        require_split(config.data_dir, "train")
        check_writable(config.run_dir, results)
    check_writable(config.cache_dir or default_cache, "cache folder (--cache-dir, $OPENKBP_CACHE_DIR)")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--reference", "reference_dir", required=True,
              help="Folder of pt_<N>/ patient folders with dose.csv (e.g. provided-data/validation-pats).")
@click.option("--predictions", "prediction_dir", required=True, help="Folder of pt_<N>.csv predicted doses.")
@click.option("--json", "json_path", default=None,
              help="Write the JSON summary here (and the per-patient CSV beside it, same name with .csv).")
@click.option("--cache-dir", default=None, help=CACHE_DIR_HELP)
@click.option("--site", default="openkbp", show_default=True,
              help="The reference patients' treatment site: openkbp, prostate, or a site file.")
def score_command(reference_dir, prediction_dir, json_path, cache_dir, site):
    """Score predicted doses with the OpenKBP challenge's dose score and DVH score (Gy)."""
    import json

    setup_logging()
    from provided_code.apps.score_folder import score_prediction_folder, write_score_reports
    from provided_code.sites import load_site

    try:
        scores = score_prediction_folder(reference_dir, prediction_dir, cache_dir=cache_dir, progress=click_progress,
                                         site=load_site(site))
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo(json.dumps(scores.summary(), indent=2))  # first: a file that cannot be written loses nothing
    if json_path is not None:
        try:
            write_score_reports(scores, Path(json_path), Path(json_path).with_suffix(".csv"))
        except OSError as error:
            raise click.ClickException(f"Could not write the scores to {json_path} (they are printed above): "
                                       f"{one_line(error)}") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_dir", type=click.Path(file_okay=False))
@click.option("--data-dir", default=None,
              help="The data folder of the model's training patients [default: the folds' --data-dir, as their "
                   "config.json records it].")
@click.option("--cache-dir", default=None, help=CACHE_DIR_HELP)
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05, show_default=True,
              help="The in-distribution check's level: a new patient is flagged outside the training cohort when "
                   "its conformal p-value is below it (a patient like the cohort is flagged at most this often). "
                   "Recorded in commissioning/cohort.json and on the model card.")
@click.option("--tolerances", "tolerances", default=None, metavar="FILE",
              help="The physicist's tolerances the model is judged by, a CSV of structure,metric,within_gy,fraction "
                   "(organs or targets for every structure of a kind; docs/commissioning.md). The verdict, which "
                   "structure-metrics pass and which fail, heads the report and the model card [default: "
                   f"{describe_tolerances()}].")
@click.option("--allow-mixed-recipes", is_flag=True,
              help="Commission folds trained with other settings than one another (network, recipe, recipe changes, "
                   "start, model name) as one model, each fold's settings on the model card [default: refused, "
                   "naming the settings and the folds].")
def commission_command(model_dir, data_dir, cache_dir, alpha, tolerances, allow_mixed_recipes):
    """Commission a cross-validated model (results/<model>, its folds trained with --folds N --fold K):
    from the folds' out-of-fold predictions, write results/<model>/commissioning/ (report.html,
    report.json, plans.csv, the model card). Nothing is predicted again."""
    setup_logging()
    from provided_code.apps.commission.run import commission

    try:
        report = commission(model_dir, data_dir=data_dir, cache_dir=cache_dir, progress=click_progress, alpha=alpha,
                            tolerances=tolerances, allow_mixed_recipes=allow_mixed_recipes)
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo(report.summary())
