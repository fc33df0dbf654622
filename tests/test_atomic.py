"""Atomic writes: nothing half-written, and a failed write names the file it was writing."""

import errno

import pytest

from provided_code.atomic import atomic_path, write_text_atomic
from provided_code.errors import ConfigError


def test_a_full_disk_deep_inside_a_writer_names_the_file_being_written(tmp_path):
    target = tmp_path / "models" / "epoch_3.keras"
    with pytest.raises(OSError) as caught:
        with atomic_path(target, suffix=".keras"):
            raise OSError(errno.ENOSPC, "No space left on device")  # as zipfile or h5py raise it: no file name
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(target)
    assert not target.exists() and not list(target.parent.iterdir())
    with pytest.raises(ConfigError, match="^bad$"):  # the package's own errors pass unchanged
        with atomic_path(target):
            raise ConfigError("bad")
    write_text_atomic(target, "fine")
    assert target.read_text() == "fine"
