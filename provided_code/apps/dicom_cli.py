"""``openkbp-dicom``: a clinic's DICOM to an OpenKBP patient folder, a predicted dose back to an RT
Dose, or both around a trained model in one command. Prints; TensorFlow loads only for ``predict``."""

from __future__ import annotations

import click

from provided_code.apps.console import USER_ERRORS, click_progress, one_line, parse_epoch, setup_logging

_PATHS = {"exists": False, "dir_okay": True, "file_okay": True}


def _import_options(command):
    for option in reversed((
        click.option("--ct", "ct_dir", required=True,
                     help="Folder of the CT series (other DICOM objects in it are ignored)."),
        click.option("--rtstruct", required=True, help="The RTSTRUCT file drawn on that CT."),
        click.option("--rtdose", default=None, help="The clinic's RTDOSE: becomes dose.csv (reference for scoring)."),
        click.option("--names", default=None,
                     help='JSON mapping structures to ROI names, e.g. {"PTV70": ["PTV_High"]} (see the README).'),
        click.option("--allow-missing-targets", is_flag=True, help="Import without PTV70/PTV63/PTV56 ROIs."),
    )):
        command = option(command)
    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """DICOM RT in and out for OpenKBP dose prediction (CT + RTSTRUCT [+ RTDOSE] -> patient folder -> RTDOSE)."""


@main.command("import")
@_import_options
@click.option("--out", required=True, help="The patient folder to write (OpenKBP layout plus dicom.json).")
def import_command(ct_dir, rtstruct, rtdose, names, allow_missing_targets, out):
    """Import one patient into the OpenKBP layout."""
    setup_logging()
    from provided_code.dicom.importer import import_patient

    try:
        report = import_patient(ct_dir, rtstruct, out, rtdose=rtdose, names=names,
                                allow_missing_targets=allow_missing_targets)
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo("\n".join(report.lines))
    voxel = report.geometry.voxel_dimensions
    click.echo(f"Wrote {report.folder} (voxels {voxel[0]:.2f} × {voxel[1]:.2f} × {voxel[2]:.2f} mm"
               f"{', with the reference dose' if report.has_dose else ''})")


@main.command("export")
@click.option("--patient", "patient_dir", required=True, help="A patient folder written by 'openkbp-dicom import'.")
@click.option("--prediction", required=True, help="The predicted dose: an OpenKBP CSV (pt_<N>.csv).")
@click.option("--out", required=True, help="The RT Dose file to write.")
@click.option("--nifti", default=None, help="Also write the dose as NIfTI here (.nii.gz).")
def export_command(patient_dir, prediction, out, nifti):
    """Write a predicted dose as an RT Dose on the patient's CT grid."""
    setup_logging()
    from provided_code.data.csv_io import read_dose_csv
    from provided_code.dicom.exporter import export_dose

    try:
        dose = read_dose_csv(prediction)
        export_dose(patient_dir, dose, out, nifti=nifti)
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo(f"Wrote {out}" + (f" and {nifti}" if nifti else ""))


@main.command("predict")
@click.option("--model-dir", required=True, help="A trained run's folder, e.g. results/unet.")
@click.option("--epoch", default=None,
              help="Checkpoint epoch or 'best' [default: best if the run has one, else newest].")
@click.option("--tta", is_flag=True, help="Average with the mirrored patient's prediction.")
@_import_options
@click.option("--out", "out_dir", required=True,
              help="Output folder: RD.dcm, dose.nii.gz, dvh.csv, dvh.json, patient/.")
@click.option("--no-plots", is_flag=True, help="Skip the DVH and slice PNGs.")
def predict_command(model_dir, epoch, tta, ct_dir, rtstruct, rtdose, names, allow_missing_targets, out_dir, no_plots):
    """Import, predict with a trained model, export RTDOSE and NIfTI, and tabulate the DVH."""
    setup_logging()
    epoch = parse_epoch(epoch)
    try:
        from provided_code.apps.clinic import predict_dicom_patient

        report = predict_dicom_patient(model_dir, ct_dir, rtstruct, out_dir, rtdose=rtdose, epoch=epoch, tta=tta,
                                       names=names, allow_missing_targets=allow_missing_targets,
                                       plots=not no_plots, progress=click_progress)
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo(report.summary())


if __name__ == "__main__":
    main()
