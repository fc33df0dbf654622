"""Reading one DICOM file, lenient about the preamble as clinical exports need."""

from __future__ import annotations

import os
from pathlib import Path

from provided_code.dicom.errors import DicomInputError, require_pydicom


PIXEL_DATA_TAGS = frozenset({0x7FE00010, 0x7FE00009, 0x7FE00008})  # Pixel Data, Double and Float Pixel Data
ROI_CONTOUR_SEQUENCE = 0x30060039


DATA_SET_GROUPS = frozenset({0x0002, 0x0008})  # the group a data set without a preamble starts with (meta, identification)
HEAD_BYTES = 132  # the preamble and the DICM prefix


def _group(data: bytes) -> set[int]:
    """The group of the element ``data`` starts with, read little and big endian."""
    return {int.from_bytes(data[:2], "little"), int.from_bytes(data[:2], "big")} if len(data) >= 4 else set()


def _may_be_dicom(handle) -> bool:
    """Whether the open file ``handle`` may hold a data set, from its first bytes: a Part 10 file
    (the 128-byte preamble and ``DICM``) or a data set without the preamble, either starting with
    file meta elements (group 0002) or, without, identification (0008); and after the file meta (its
    group length says where it ends) an element of a group other than 0000. Anything else (a PDF,
    a text, zeros after a preamble) is not read on: pydicom would walk a file of zeros 8 bytes at a
    time to its end."""
    head = handle.read(HEAD_BYTES)
    start = 128 if head[128:132] == b"DICM" else 0
    handle.seek(start + (4 if start else 0))
    first = handle.read(12)
    groups = _group(first)
    if not groups & DATA_SET_GROUPS:
        return False
    if 0x0002 in groups and first[4:6] == b"UL":  # explicit VR little endian, as the file meta is written
        meta_length = int.from_bytes(first[8:12], "little")
        handle.seek(handle.tell() + meta_length)
        after = handle.read(4)
        return len(after) < 4 or 0 not in _group(after)
    return True


def read_dataset(path: os.PathLike | str, stop_before_pixels: bool = False, stop_before_contours: bool = False):
    """The dataset in ``path``, or None if it is not DICOM. Files without the 128-byte preamble
    and ``DICM`` prefix (older exports, some of pydicom's own examples) are read too when they start
    as a data set does. ``stop_before_contours``: an RT Structure Set is read up to its
    ``ROIContourSequence`` (tens of MB in clinical files, which pydicom parses whole when it has an
    undefined length, as planning systems write it, even if ``specific_tags`` leaves it out), so
    without it and what follows it (``RTROIObservationsSequence``, the approval).

    A file is DICOM when its data set holds a SOP Class, a modality or a media storage SOP Class
    (a DICOMDIR); the reading stops at an element of group 0000, which no stored data set holds
    (what a file of zeros, or a preamble with zeros after it, would give forever): the file's
    start decides, not its length."""
    pydicom = require_pydicom()
    stop = set(PIXEL_DATA_TAGS) if stop_before_pixels else set()
    if stop_before_contours:
        stop.add(ROI_CONTOUR_SEQUENCE)

    def stop_when(tag, vr, length) -> bool:
        return tag in stop or tag >> 16 == 0

    try:
        with open(path, "rb") as handle:
            if not _may_be_dicom(handle):
                return None
            handle.seek(0)
            try:
                dataset = pydicom.filereader.read_partial(handle, stop_when, force=False)
            except pydicom.errors.InvalidDicomError:
                handle.seek(0)
                dataset = pydicom.filereader.read_partial(handle, stop_when, force=True)
    except (OSError, EOFError):
        return None
    except Exception:  # noqa: BLE001 - reads of arbitrary bytes fail in many ways
        return None
    meta = getattr(dataset, "file_meta", None)
    if "SOPClassUID" in dataset or "Modality" in dataset or (meta is not None and "MediaStorageSOPClassUID" in meta):
        dataset.filename = str(path)
        return dataset
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
