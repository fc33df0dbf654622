"""The package's version, as its outputs name it (an RT Dose's Software Versions)."""

import importlib.metadata
import re

from provided_code.infra import version


def test_without_the_installed_metadata_the_version_is_the_checkouts(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    version.package_version.cache_clear()
    try:
        assert version.package_version() == re.search(r"(?m)^version = (\S+)$",
                                                      version.SETUP_CFG.read_text()).group(1)
        monkeypatch.setattr(version, "SETUP_CFG", version.SETUP_CFG.parent / "no-such-setup.cfg")
        version.package_version.cache_clear()
        assert version.package_version() == "unknown"
    finally:
        version.package_version.cache_clear()
