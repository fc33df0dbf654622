"""Clinical ROI names to a site's structures and the body outline.

Names are compared after normalisation: lower case, every character that is not a letter or a
digit removed, so ``Parotid_L``, ``parotid l`` and ``PAROTID-L`` are one name. The default table
is the site's (each structure's ``dicom_names`` in its site file, ``body.dicom_names`` for the
body; OpenKBP's covers the TG-263 forms and common variants); a names file (JSON:
``{"PTV70": ["PTV_High", ...]}``) replaces the default list of each structure it names and keeps
the others. ``BODY`` is the outline that becomes the possible-dose mask.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from provided_code.dicom.errors import DicomInputError, require_site
from provided_code.sites import Site, normalise_name

BODY = "BODY"


def default_names(site: Site) -> dict[str, tuple[str, ...]]:
    """The site's table: each structure, in channel order, then ``BODY``, to the ROI names it is matched from."""
    site = require_site(site)
    return {**{structure.name: structure.dicom_names for structure in site.structures}, BODY: site.body_names}


def load_names(path: os.PathLike | str | None, site: Site) -> dict[str, tuple[str, ...]]:
    """The site's table (:func:`default_names`), with the structures a names file at ``path``
    (None: none) lists replaced by its lists."""
    table = default_names(site)
    if path is None:
        return table
    path = Path(path)
    try:
        given = json.loads(path.read_text())
    except FileNotFoundError:
        raise DicomInputError(path, "names file is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DicomInputError(path, f"names file is not JSON ({error})") from None
    if not isinstance(given, dict):
        example = max(site.targets, key=site.prescriptions_gy.get)
        raise DicomInputError(path, f'names file must be a JSON object such as {{"{example}": ["PTV_High"]}}')
    for key, names in given.items():
        if key not in table:
            raise DicomInputError(path, f"unknown structure {key!r}; expected one of {', '.join(table)}")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not all(isinstance(n, str) and normalise_name(n) for n in names):
            raise DicomInputError(path, f"{key!r} must map to a list of ROI names")
        table[key] = tuple(names)
    return table


def match_rois(roi_names: list[str], table: dict[str, tuple[str, ...]], source: os.PathLike | str) -> dict[str, str]:
    """Structure (or ``BODY``) → the ROI name that is it, for the structures of ``table``. An ROI
    matching two structures, or two ROIs matching one, is an error naming them (a names file settles it)."""
    wanted = {key: {normalise_name(n) for n in names} for key, names in table.items()}
    matches: dict[str, list[str]] = {key: [] for key in table}
    for roi in roi_names:
        keys = [key for key in table if normalise_name(roi) in wanted[key]]
        if len(keys) > 1:
            raise DicomInputError(source, f"ROI {roi!r} matches {' and '.join(keys)}; pass --names to settle it")
        if keys:
            matches[keys[0]].append(roi)
    mapping = {}
    for key, rois in matches.items():
        if len(rois) > 1:
            raise DicomInputError(source, f"ROIs {', '.join(map(repr, rois))} all match {key}; "
                                          f"pass --names with the one to use")
        if rois:
            mapping[key] = rois[0]
    return mapping


def describe_matching(mapping: dict[str, str], roi_names: list[str], keys: tuple[str, ...]) -> list[str]:
    """Lines for the user: which ROI became which structure (of ``keys``, a table's keys), what is
    missing, what was unused."""
    width = max(12, *(len(key) for key in keys))
    lines = [f"{key:<{width}} <- {mapping[key]!r}" for key in keys if key in mapping]
    missing = [key for key in keys if key not in mapping]
    if missing:
        lines.append(f"missing: {', '.join(missing)}")
    unused = [roi for roi in roi_names if roi not in mapping.values()]
    if unused:
        lines.append(f"unused ROIs: {', '.join(map(repr, unused))}")
    return lines


def missing_targets(mapping: dict[str, str], site: Site) -> list[str]:
    """The site's targets no ROI of ``mapping`` is."""
    return [t for t in require_site(site).targets if t not in mapping]
