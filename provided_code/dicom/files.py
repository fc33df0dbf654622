"""Reading one DICOM file, lenient about the preamble as clinical exports need."""

from __future__ import annotations

import os
from pathlib import Path

from provided_code.dicom.errors import DicomInputError, require_pydicom


PIXEL_DATA_TAGS = frozenset({0x7FE00010, 0x7FE00009, 0x7FE00008})  # Pixel Data, Double and Float Pixel Data
ROI_CONTOUR_SEQUENCE = 0x30060039


def read_dataset(path: os.PathLike | str, stop_before_pixels: bool = False, stop_before_contours: bool = False):
    """The dataset in ``path``, or None if it is not DICOM. Files without the 128-byte preamble
    and ``DICM`` prefix (older exports, some of pydicom's own examples) are read too when they hold
    a SOP Class or a modality. ``stop_before_contours``: an RT Structure Set is read up to its
    ``ROIContourSequence`` (tens of MB in clinical files, which pydicom parses whole when it has an
    undefined length, as planning systems write it, even if ``specific_tags`` leaves it out), so
    without it and what follows it (``RTROIObservationsSequence``, the approval)."""
    pydicom = require_pydicom()
    stop = set(PIXEL_DATA_TAGS) if stop_before_pixels else set()
    if stop_before_contours:
        stop.add(ROI_CONTOUR_SEQUENCE)

    def read(force: bool):
        if not stop:
            return pydicom.dcmread(path, force=force)
        with open(path, "rb") as handle:
            return pydicom.filereader.read_partial(handle, lambda tag, vr, length: tag in stop, force=force)

    try:
        return read(force=False)
    except pydicom.errors.InvalidDicomError:
        pass
    except (EOFError, OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    try:
        dataset = read(force=True)
        if "SOPClassUID" in dataset or "Modality" in dataset:
            return dataset
    except Exception:  # noqa: BLE001 - forced reads of arbitrary bytes fail in many ways
        pass
    return None


def read_required(path: os.PathLike | str, modality: str, what: str):
    """The dataset of a file that must be DICOM of ``modality``; one-line errors otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DicomInputError(path, f"{what} file is missing")
    dataset = read_dataset(path)
    if dataset is None:
        raise DicomInputError(path, f"not a DICOM file (expected the {what})")
    if dataset.get("Modality") != modality:
        raise DicomInputError(path, f"not an {what} (modality {dataset.get('Modality')!r})")
    return dataset


def pixel_array(dataset, path: os.PathLike | str, what: str):
    """``dataset.pixel_array``, or one line naming the file and the problem: for compressed pixels
    without an installed decoder, the transfer syntax and what to install (pydicom's plugin list
    would take several lines)."""
    require_pydicom()
    from pydicom.pixels import get_decoder

    syntax = getattr(getattr(dataset, "file_meta", None), "TransferSyntaxUID", None)
    if syntax is not None and syntax.is_transfer_syntax and syntax.is_compressed:
        try:
            decoder = get_decoder(syntax)
        except NotImplementedError:
            raise DicomInputError(path, f"{what} pixels are compressed as {syntax.name} ({syntax}), which pydicom "
                                        f"cannot decode") from None
        if not decoder.is_available:
            needs = "; ".join(decoder.missing_dependencies) or "a pixel data plugin"
            extra = ("pip install 'provided_code[dicom]' installs one (pylibjpeg-openjpeg); "
                     if "pylibjpeg-openjpeg" in needs else "")
            raise DicomInputError(path, f"{what} pixels are compressed as {syntax.name} ({syntax}) and no decoder for "
                                        f"it is installed: {extra}pydicom's plugins need {needs}")
    try:
        return dataset.pixel_array
    except Exception as error:  # pydicom raises many kinds for undecodable pixel data, some over several lines
        message = " ".join(str(error).split())
        raise DicomInputError(path, f"cannot read the {what} pixels ({type(error).__name__}: {message})") from None
