"""``openkbp-dicom``: a clinic's DICOM to an OpenKBP patient folder, a predicted dose back to an RT
Dose, or both around a trained model in one command; or a DICOM node that does it for a planning
system (``serve``). Prints; TensorFlow loads only for ``predict`` and ``serve``."""

from __future__ import annotations

from pathlib import Path

import click

from provided_code.apps.console import USER_ERRORS, click_progress, one_line, parse_epoch, setup_logging
from provided_code.metrics.calibration import DEFAULT_COVERAGE, check_coverage

_PATHS = {"exists": False, "dir_okay": True, "file_okay": True}


def _import_options(command):
    for option in reversed((
        click.option("--ct", "ct_dir", required=True,
                     help="Folder of the CT series (other DICOM objects in it are ignored)."),
        click.option("--rtstruct", required=True, help="The RTSTRUCT file drawn on that CT."),
        click.option("--rtdose", default=None, help="The clinic's RTDOSE: becomes dose.csv (reference for scoring)."),
        click.option("--names", default=None,
                     help='JSON mapping structures to ROI names, e.g. {"PTV70": ["PTV_High"]} (see the README).'),
        click.option("--allow-missing-targets", is_flag=True,
                     help="Import without ROIs for the site's required targets (OpenKBP's: PTV70; a missing optional "
                          "one, PTV63 or PTV56, is imported with a warning without it)."),
    )):
        command = option(command)
    return command


_SITES = "openkbp, prostate or a site file (.json)"
_BAND_HELP = ("Nominal coverage of the prediction bands of a commissioned cross-validated model (0.9: each band holds "
              "the value a plan achieves 90 % of the time).")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """DICOM RT in and out for OpenKBP dose prediction (CT + RTSTRUCT [+ RTDOSE] -> patient folder -> RTDOSE)."""


@main.command("import")
@_import_options
@click.option("--out", required=True, help="The patient folder to write (OpenKBP layout plus dicom.json).")
@click.option("--site", default="openkbp", show_default=True,
              help=f"The treatment site: {_SITES}; its structures and the ROI names they are matched from.")
def import_command(ct_dir, rtstruct, rtdose, names, allow_missing_targets, out, site):
    """Import one patient into the OpenKBP layout."""
    setup_logging()
    from provided_code.dicom.importer import import_patient
    from provided_code.sites import load_site

    try:
        report = import_patient(ct_dir, rtstruct, out, rtdose=rtdose, names=names,
                                allow_missing_targets=allow_missing_targets, site=load_site(site))
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo("\n".join(report.lines))
    voxel = report.geometry.voxel_dimensions
    click.echo(f"Wrote {report.folder} (voxels {voxel[0]:.2f} × {voxel[1]:.2f} × {voxel[2]:.2f} mm"
               f"{', with the reference dose' if report.has_dose else ''})")


@main.command("import-cohort")
@click.argument("archive", type=click.Path(exists=True, file_okay=False))
@click.option("--site", default="openkbp", show_default=True,
              help=f"The treatment site: {_SITES}; its structures, the ROI names they are matched from and its "
                   f"targets' prescriptions (where a plan names none).")
@click.option("--out", "out_dir", required=True,
              help="The data folder to write: train-pats/, validation-pats/, manifest.csv, identity-map.csv.")
@click.option("--names", default=None,
              help='JSON mapping structures to ROI names, e.g. {"PTV70": ["PTV_High"]} (see the README).')
@click.option("--validation", default="0.2", show_default=True,
              help="Patients in validation-pats/: a fraction (0.2) or a count (30).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split's hash.")
@click.option("--strict", is_flag=True, help="Stop at the first patient that fails.")
@click.option("--identity-map", default=None,
              help="The pseudonym -> PatientID file [default: OUT/identity-map.csv]; keep it off shared storage.")
@click.option("--allow-missing-targets", is_flag=True,
              help="Import patients without some of the site's required targets (optional ones never need it).")
@click.option("--change-site", is_flag=True,
              help="Import every patient again for --site when the data folder was imported for another site.")
@click.option("--reassign-pseudonyms", is_flag=True,
              help="Accept an identity map that gives a pseudonym to another patient of the archive than the one it "
                   "was given to (that patient is imported under it, over the earlier import).")
def import_cohort_command(archive, site, out_dir, names, validation, seed, strict, identity_map, allow_missing_targets,
                          change_site, reassign_pseudonyms):
    """Import a clinic's DICOM archive (any folder tree) into a training set, one plan per patient."""
    setup_logging()
    from provided_code.dicom.cohort import import_cohort
    from provided_code.sites import load_site

    try:
        report = import_cohort(archive, out_dir, site=load_site(site), names_file=names,
                               validation=validation, seed=seed, strict=strict, identity_map=identity_map,
                               allow_missing_targets=allow_missing_targets, change_site=change_site,
                               reassign_pseudonyms=reassign_pseudonyms, progress=click_progress)
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    for line in report.lines:
        click.echo(line)
    click.echo(report.summary())
    if report.failed:
        raise SystemExit(1)


_SUPERSAMPLE = click.option(
    "--dvh-supersample", type=click.IntRange(min=1), default=1, show_default=True,
    help="Sample the DVH table at N × N × N points per CT voxel (the dose trilinear, each contour a slice "
         "thick); 1: at the voxel centres (structures of few voxels are supersampled all the same).")


@main.command("export")
@click.option("--patient", "patient_dir", required=True, help="A patient folder written by 'openkbp-dicom import'.")
@click.option("--prediction", required=True, help="The predicted dose: an OpenKBP CSV (pt_<N>.csv).")
@click.option("--out", required=True, help="The RT Dose file to write.")
@click.option("--nifti", default=None, help="Also write the dose as NIfTI here (.nii.gz).")
@click.option("--rtstruct", default=None,
              help="The RTSTRUCT the patient was imported from: with --dvh, the DVH table of the RT Dose.")
@click.option("--dvh", "dvh_csv", default=None,
              help="Write the DVH table here (.csv; its JSON beside it, .json); needs --rtstruct.")
@_SUPERSAMPLE
@click.option("--site", default=None,
              help=f"The site the prediction is of ({_SITES}); a patient imported for another is refused "
                   f"[default: the patient's, from its dicom.json; a site file's must be given].")
def export_command(patient_dir, prediction, out, nifti, rtstruct, dvh_csv, dvh_supersample, site):
    """Write a predicted dose as an RT Dose on the patient's CT grid (and its DVH table)."""
    if (rtstruct is None) != (dvh_csv is None):
        raise click.UsageError("--rtstruct and --dvh go together: the DVH table needs the structures and a file.")
    setup_logging()
    from provided_code.data.csv_io import read_dose_csv
    from provided_code.dicom.exporter import export_dose, site_of_patient
    from provided_code.sites import load_site

    try:
        site = site_of_patient(patient_dir) if site is None else load_site(site)
        dose = read_dose_csv(prediction)
        export_dose(patient_dir, dose, out, nifti=nifti, site=site, rtstruct=rtstruct, dvh=dvh_csv,
                    dvh_supersample=dvh_supersample)
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    written = [out, *([nifti] if nifti else []), *([dvh_csv, str(Path(dvh_csv).with_suffix(".json"))] if dvh_csv else [])]
    click.echo(f"Wrote {', '.join(written[:-1])} and {written[-1]}" if len(written) > 1 else f"Wrote {out}")


@main.command("predict")
@click.option("--model-dir", required=True,
              help="A trained run's folder, e.g. results/unet, or a cross-validated model's (its folds predict together).")
@click.option("--epoch", default=None,
              help="Checkpoint epoch or 'best' [default: best if the run has one, else newest].")
@click.option("--tta", is_flag=True, help="Average with the mirrored patient's prediction.")
@_import_options
@click.option("--out", "out_dir", required=True,
              help="Output folder: RD.dcm, dose.nii.gz, dvh.csv, dvh.json, patient/.")
@click.option("--no-plots", is_flag=True, help="Skip the DVH and slice PNGs.")
@_SUPERSAMPLE
@click.option("--site", default=None,
              help=f"The treatment site ({_SITES}): the model's own, from its config.json, whose structures and "
                   f"ROI names the import uses; another is refused [default: the model's].")
@click.option("--band", type=float, default=DEFAULT_COVERAGE, show_default=True, help=_BAND_HELP)
def predict_command(model_dir, epoch, tta, ct_dir, rtstruct, rtdose, names, allow_missing_targets, out_dir, no_plots,
                    dvh_supersample, site, band):
    """Import, predict with a trained model, export RTDOSE and NIfTI, and tabulate the DVH."""
    setup_logging()
    epoch = parse_epoch(epoch)
    try:
        from provided_code.apps.clinic import predict_dicom_patient
        from provided_code.deployed_model import DeployedModel
        from provided_code.dicom.dvh import check_supersample

        check_supersample(dvh_supersample)
        band = check_coverage(band)
        # read while no training changes the model's folders (a node holds its own)
        with DeployedModel.locked(model_dir, "read by openkbp-dicom predict", epoch, site) as model:
            report = predict_dicom_patient(model, ct_dir, rtstruct, out_dir, rtdose=rtdose, tta=tta, names=names,
                                           allow_missing_targets=allow_missing_targets, plots=not no_plots,
                                           progress=click_progress, dvh_supersample=dvh_supersample,
                                           trust=model.trust(band))
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    click.echo(report.summary())


@main.command("serve")
@click.option("--model-dir", default=None, help="A trained run's folder, e.g. results/unet (not needed with --status).")
@click.option("--store", "store_dir", required=True,
              help="The node's folder: objects received, results, journal.sqlite (created if missing).")
@click.option("--status", is_flag=True, help="Print the summary of the journal in --store and exit.")
@click.option("--resend", default=None, metavar="UID|PATIENTID",
              help="Send this patient's RT Dose now (a structure set UID, or a PatientID: each of its patients) and "
                   "exit: a running node sends it within a second, a stopped one at its start; once, as always.")
@click.option("--ae-title", default="KBP", show_default=True, help="This node's AE title (the called AE title).")
@click.option("--host", default="0.0.0.0", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=11112, show_default=True, help="The port to listen on.")
@click.option("--send-to", default=None, help="Where each RT Dose goes: AE@HOST:PORT (planning system or PACS).")
@click.option("--allow", default=None, help="Calling AE titles allowed in, comma-separated [default: any].")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TLS: this node's certificate (PEM); with --tls-key, associations only over TLS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False), default=None, help="TLS: its private key (PEM).")
@click.option("--tls-ca", type=click.Path(exists=True, dir_okay=False), default=None,
              help="TLS: the CA (PEM) that signs the clients' and the destination's certificates: clients must "
                   "present one, and --send-to is reached over TLS.")
@click.option("--completion-timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True,
              help="Seconds without a new object after which a patient with CT images missing fails.")
@click.option("--max-object-mb", type=click.FloatRange(min=0.001), default=2048.0, show_default=True,
              help="Largest object accepted (MB); a larger one is refused with status A700.")
@click.option("--min-free-mb", type=click.FloatRange(min=0), default=1024.0, show_default=True,
              help="Free-disk floor (MB) of the store: below it objects are refused with status A700.")
@click.option("--send-retry-hours", type=click.FloatRange(min=0, min_open=True), default=24.0, show_default=True,
              help="Hours after a patient's first failed send that its RT Dose is still retried (with back-off); "
                   "then the patient fails (--resend sends it again).")
@click.option("--send-backoff", type=click.FloatRange(min=0.01), default=5.0, show_default=True,
              help="Seconds before the second attempt; doubling after each failure, at most 300 s.")
@click.option("--max-associations", type=click.IntRange(min=1), default=20, show_default=True,
              help="Associations served at once; one more is rejected (transient) and logged with its address.")
@click.option("--max-per-caller", type=click.IntRange(min=1), default=5, show_default=True,
              help="Of those, associations at once from one calling AE title at one address (a system that holds "
                   "more locks out no one else); one more is rejected (transient) and journaled.")
@click.option("--max-per-address", type=click.IntRange(min=1), default=10, show_default=True,
              help="Of those, associations at once from one address under any calling AE titles (one host posing "
                   "as several systems); one more is rejected (transient) and journaled. Keep it below "
                   "--max-associations.")
@click.option("--max-pending", type=click.IntRange(min=1), default=100, show_default=True,
              help="Connections at once that have not requested an association yet; beyond, the oldest is closed.")
@click.option("--acse-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds a connection has to finish its TLS handshake and request an association.")
@click.option("--network-timeout", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds an association may stay silent before it is aborted (and a send waits for an answer).")
@click.option("--epoch", default=None, help="Checkpoint epoch or 'best' [default: best if the run has one, else newest].")
@click.option("--tta", is_flag=True, help="Average with the mirrored patient's prediction.")
@click.option("--names", default=None, help="JSON mapping structures to ROI names (as for 'predict').")
@click.option("--allow-missing-targets", is_flag=True,
              help="Predict without ROIs for the model's required targets (OpenKBP's: PTV70).")
@click.option("--band", type=float, default=DEFAULT_COVERAGE, show_default=True, help=_BAND_HELP)
@click.option("--verbose", is_flag=True,
              help="Also pynetdicom's own log (every association and message) and pydicom's warnings about the data.")
def serve_command(model_dir, store_dir, status, resend, ae_title, host, port, send_to, allow, tls_cert, tls_key, tls_ca,
                  completion_timeout, max_object_mb, min_free_mb, send_retry_hours, send_backoff, max_associations,
                  max_per_caller, max_per_address, max_pending, acse_timeout, network_timeout, epoch, tta, names,
                  allow_missing_targets, band, verbose):
    """A DICOM node: receive CT + RTSTRUCT [+ RTDOSE] by C-STORE, predict, send the RT Dose back."""
    setup_logging()
    if status:
        from provided_code.apps.node.journal import Journal, summary_lines
        from provided_code.apps.node.store import JOURNAL_FILE

        try:
            journal = Journal(Path(store_dir) / JOURNAL_FILE, readonly=True)
            click.echo("\n".join(summary_lines(journal)))
        except USER_ERRORS as error:
            raise click.ClickException(one_line(error)) from None
        return
    if resend is not None:
        from provided_code.apps.node.journal import resend_lines

        try:
            lines, pushed = resend_lines(Path(store_dir), resend)
        except USER_ERRORS as error:
            raise click.ClickException(one_line(error)) from None
        click.echo("\n".join(lines))
        if not pushed:
            raise SystemExit(1)
        return
    if model_dir is None:
        raise click.UsageError("--model-dir is required (unless --status).")
    if (tls_cert is None) != (tls_key is None) or (tls_ca is not None and tls_cert is None):
        raise click.UsageError("--tls-cert and --tls-key go together; --tls-ca needs them.")
    epoch = parse_epoch(epoch)
    import logging
    import signal
    import threading
    import warnings

    from provided_code.errors import UserError
    from provided_code.apps.node.sender import check_ae_title, parse_destination
    from provided_code.apps.node.server import Node, NodeSettings

    logging.getLogger("pynetdicom").setLevel(logging.INFO if verbose else logging.CRITICAL)
    if not verbose:  # what a client sends is judged by the node, in one line per object; pydicom's words on it are
        logging.getLogger("pydicom").setLevel(logging.ERROR)  # many lines per object (a bad UID, an ESC byte)
        warnings.filterwarnings("ignore", module="pydicom")
    try:
        check_coverage(band)
        settings = NodeSettings(
            store=Path(store_dir), ae_title=check_ae_title(ae_title, "ae_title"), host=host, port=port,
            send_to=parse_destination(send_to) if send_to else None,
            allow=tuple(check_ae_title(title, "allow") for title in allow.split(",")) if allow else (),
            tls_cert=tls_cert and Path(tls_cert), tls_key=tls_key and Path(tls_key), tls_ca=tls_ca and Path(tls_ca),
            completion_timeout=completion_timeout, max_object_bytes=int(max_object_mb * 1e6),
            min_free_bytes=int(min_free_mb * 1e6), send_retry_for=send_retry_hours * 3600.0, send_backoff=send_backoff,
            max_associations=max_associations, max_per_caller=max_per_caller, max_per_address=max_per_address,
            max_pending=max_pending, acse_timeout=acse_timeout, network_timeout=network_timeout)
    except UserError as error:
        raise click.BadParameter(str(error)) from None
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        from provided_code.apps.node.predictor import ModelPredictor

        predictor = ModelPredictor(model_dir, epoch=epoch, tta=tta, names=names,
                                   allow_missing_targets=allow_missing_targets, band=band)
        node = Node(settings, predictor).start()
    except USER_ERRORS as error:
        raise click.ClickException(one_line(error)) from None
    while not stop.wait(1.0):
        pass
    click.echo("Stopping: finishing the running prediction, if any.", err=True)
    node.stop()
    predictor.close()


if __name__ == "__main__":
    main()
