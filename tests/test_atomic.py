"""Atomic writes and folders: nothing half-written, a failed write names the file it was writing, and a
folder replaced whole (swapped in one step, or, without that call, recovered after a kill)."""

import errno

import pytest

import provided_code.infra.atomic as atomic
from provided_code.errors import ConfigError
from provided_code.infra.atomic import (
    atomic_path,
    held_atomic_path,
    new_folder_beside,
    remove_dead_temporaries,
    replace_folder,
    tidy_folder,
    write_text_atomic,
)


def _fill(folder, text):
    (folder / "pt_1.csv").write_text(text)
    (folder / "scores.json").write_text(text)


def _contents(folder):
    return {path.name: path.read_text() for path in folder.iterdir()}


def test_a_folder_is_replaced_whole_and_nothing_is_left_beside_it(tmp_path, monkeypatch):
    final = tmp_path / "validation-predictions"
    for exchange in (True, False):  # renameat2's swap, and the two renames elsewhere
        if not exchange:
            monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
        for text in ("first", "second"):
            new = new_folder_beside(final)
            assert new.name.startswith(".validation-predictions.tmp-")
            _fill(new, text)
            replace_folder(new, final)
            assert _contents(final) == {"pt_1.csv": text, "scores.json": text}
            assert sorted(path.name for path in tmp_path.iterdir()) == ["validation-predictions"]


def test_a_kill_between_the_two_renames_is_undone_by_the_next_run(tmp_path):
    final = tmp_path / "validation-predictions"
    old, new = tmp_path / ".validation-predictions.old-123", tmp_path / ".validation-predictions.tmp-123"
    old.mkdir()
    _fill(old, "previous")
    new.mkdir()
    (new / "pt_1.csv").write_text("half")
    tidy_folder(final)
    assert _contents(final) == {"pt_1.csv": "previous", "scores.json": "previous"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["validation-predictions"]


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


def test_only_temporaries_nobody_holds_are_removed(tmp_path):
    """A temporary that a killed writer left (no holder) is removed; one being written (held) is
    kept, and so is anything that is not a temporary of that name."""
    dead = tmp_path / ".cache.h5.4242.0123abcd.tmp"  # as a writer killed before this change left it
    dead.write_bytes(b"half")
    (tmp_path / ".other.h5.4242.0123abcd.tmp").write_bytes(b"another file's")
    (tmp_path / "cache.h5.notes").write_text("not a temporary")
    with held_atomic_path(tmp_path / "cache.h5") as tmp:
        tmp.write_bytes(b"being written")  # the same file: the holder's lock is on it
        assert remove_dead_temporaries(tmp_path, "cache.h5") == [dead]
        assert tmp.exists()
    assert (tmp_path / "cache.h5").read_bytes() == b"being written"
    assert sorted(path.name for path in tmp_path.iterdir()) == [".other.h5.4242.0123abcd.tmp", "cache.h5",
                                                                  "cache.h5.notes"]

