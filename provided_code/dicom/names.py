"""Clinical ROI names to the ten OpenKBP structures and the body outline.

Names are compared after normalisation: lower case, every character that is not a letter or a
digit removed, so ``Parotid_L``, ``parotid l`` and ``PAROTID-L`` are one name. The default table
covers the TG-263 forms and common variants; a names file (JSON: ``{"PTV70": ["PTV_High", ...]}``)
replaces the default list of each structure it names and keeps the others. ``BODY`` is the outline
that becomes the possible-dose mask.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from provided_code.constants import STRUCTURES, TARGETS
from provided_code.dicom.errors import DicomInputError

BODY = "BODY"
KEYS = (*STRUCTURES, BODY)

DEFAULT_NAMES: dict[str, tuple[str, ...]] = {
    "Brainstem": ("Brainstem", "Brain_Stem", "BrainStem_PRV0", "Tronc"),
    "SpinalCord": ("SpinalCord", "Spinal_Cord", "Cord", "Spinal Canal", "SpinalCanal", "Medulla"),
    "RightParotid": ("Parotid_R", "R_Parotid", "Rt_Parotid", "Parotid_Rt", "RightParotid", "Parotid Right",
                     "Right Parotid", "ParotidR", "RParotid"),
    "LeftParotid": ("Parotid_L", "L_Parotid", "Lt_Parotid", "Parotid_Lt", "LeftParotid", "Parotid Left",
                    "Left Parotid", "ParotidL", "LParotid"),
    "Esophagus": ("Esophagus", "Oesophagus", "Esophagus_Cervical", "Esoph"),
    "Larynx": ("Larynx", "Glottis", "Larynx_Glottic"),
    "Mandible": ("Mandible", "Bone_Mandible", "Jaw"),
    "PTV56": ("PTV56", "PTV_56", "PTV5600", "PTV_5600", "PTV56Gy", "PTV_56Gy", "PTV_Low"),
    "PTV63": ("PTV63", "PTV_63", "PTV6300", "PTV_6300", "PTV63Gy", "PTV_63Gy", "PTV_Mid", "PTV_Intermediate"),
    "PTV70": ("PTV70", "PTV_70", "PTV7000", "PTV_7000", "PTV70Gy", "PTV_70Gy", "PTV_High"),
    BODY: ("BODY", "External", "Skin", "Outline", "Body_Contour", "Patient"),
}


def normalise(name: str) -> str:
    """``'Parotid_L '`` → ``'parotidl'``: lower case, letters and digits only."""
    return re.sub(r"[^0-9a-z]", "", name.lower())


def load_names(path: os.PathLike | str | None = None) -> dict[str, tuple[str, ...]]:
    """The default table, with the structures a names file lists replaced by its lists."""
    table = dict(DEFAULT_NAMES)
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
        raise DicomInputError(path, 'names file must be a JSON object such as {"PTV70": ["PTV_High"]}')
    for key, names in given.items():
        if key not in KEYS:
            raise DicomInputError(path, f"unknown structure {key!r}; expected one of {', '.join(KEYS)}")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not all(isinstance(n, str) and normalise(n) for n in names):
            raise DicomInputError(path, f"{key!r} must map to a list of ROI names")
        table[key] = tuple(names)
    return table


def match_rois(roi_names: list[str], table: dict[str, tuple[str, ...]], source: os.PathLike | str) -> dict[str, str]:
    """Structure (or ``BODY``) → the ROI name that is it. An ROI matching two structures, or two
    ROIs matching one, is an error naming them (a names file settles it)."""
    wanted = {key: {normalise(n) for n in names} for key, names in table.items()}
    matches: dict[str, list[str]] = {key: [] for key in KEYS}
    for roi in roi_names:
        keys = [key for key in KEYS if normalise(roi) in wanted[key]]
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


def describe_matching(mapping: dict[str, str], roi_names: list[str]) -> list[str]:
    """Lines for the user: which ROI became which structure, what is missing, what was unused."""
    lines = [f"{key:<12} <- {mapping[key]!r}" for key in KEYS if key in mapping]
    missing = [key for key in KEYS if key not in mapping]
    if missing:
        lines.append(f"missing: {', '.join(missing)}")
    unused = [roi for roi in roi_names if roi not in mapping.values()]
    if unused:
        lines.append(f"unused ROIs: {', '.join(map(repr, unused))}")
    return lines


def missing_targets(mapping: dict[str, str]) -> list[str]:
    return [t for t in TARGETS if t not in mapping]
