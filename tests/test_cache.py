import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pandas as pd
import pytest

from provided_code.constants import CT_MAX
from provided_code.errors import UserError
from provided_code.sites import openkbp
from provided_code.data.cache import CACHE_FORMAT_VERSION, cache_path_for, load_cache, load_split
from provided_code.data.chunks import CacheError
from provided_code.data.csv_io import PatientDataError, read_patient, write_dose_csv, write_sparse_csv
from tests.kit.cache_files import flip_a_byte, flip_a_table_byte
from tests.kit.repo import SAMPLE_DIR
from tests.kit.skips import requires_sample
from tests.kit.tiers import SLOW_FOR_ITS_TIME

STRUCTURES = openkbp().names  # OpenKBP's channel order


def _files(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_cache_matches_csvs_and_is_compact(phantom_split, tmp_path):
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=2, site=openkbp())
    assert arrays.patient_ids == ["pt_1", "pt_2", "pt_3"]
    for row, pid in enumerate(arrays.patient_ids):
        patient = read_patient(phantom_split / pid, site=openkbp())
        assert np.array_equal(arrays.ct[row], patient.ct)
        assert np.array_equal(arrays.structure_masks[row], patient.structure_masks)
        assert np.array_equal(arrays.possible_dose_mask[row], patient.possible_dose_mask)
        assert np.array_equal(arrays.dose[row], patient.dose)
        assert np.array_equal(arrays.voxel_dimensions[row], patient.voxel_dimensions)
    assert arrays.structure_present.all() and arrays.has_dose.all()
    for name in ("ct", "structure_masks", "possible_dose_mask", "dose"):
        assert getattr(arrays, name).flags["C_CONTIGUOUS"]
    assert arrays.nbytes / len(arrays) <= 40e6  # the RAM budget per patient at 128³
    # The cache lives in the cache folder, never beside the CSVs.
    assert cache_path_for(phantom_split, tmp_path / "c", site=openkbp()).parent == tmp_path / "c"
    assert _files(phantom_split) == ["pt_1", "pt_2", "pt_3"]


def test_cache_is_reused_then_rebuilt_when_a_source_changes(phantom_split, tmp_path, caplog):
    cache_dir = tmp_path / "c"
    load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    path = cache_path_for(phantom_split, cache_dir, site=openkbp())
    built = path.stat().st_mtime_ns
    load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    assert path.stat().st_mtime_ns == built  # reused

    dose_path = phantom_split / "pt_2" / "dose.csv"
    dose = read_patient(phantom_split / "pt_2", site=openkbp()).dose
    dose[dose > 0] += 1.0
    write_dose_csv(dose_path, dose)
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    assert "is stale" in caplog.text
    assert np.array_equal(arrays.dose[1], dose)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_cache_is_detected_and_rebuilt(phantom_split, tmp_path, caplog, damage):
    cache_dir = tmp_path / "c"
    expected = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    path = cache_path_for(phantom_split, cache_dir, site=openkbp())
    size = path.stat().st_size
    if damage == "truncate":
        with open(path, "r+b") as handle:
            handle.truncate(size // 2)
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    else:
        path.write_bytes(b"")
    with pytest.raises(CacheError):
        load_cache(path, site=openkbp())
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    assert "Rebuilding cache" in caplog.text
    assert np.array_equal(arrays.dose, expected.dose) and np.array_equal(arrays.ct, expected.ct)


@pytest.mark.parametrize("volume", ["ct", "dose"])
def test_a_flipped_byte_inside_a_chunk_fails_its_checksum_and_the_cache_is_rebuilt(phantom_split, tmp_path, caplog,
                                                                                    volume):
    cache_dir = tmp_path / "c"
    expected = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    path = cache_path_for(phantom_split, cache_dir, site=openkbp())
    flip_a_byte(path, volume, 1)  # in the middle of patient 2's chunk; size and time unchanged: only the bytes tell
    with pytest.raises(CacheError, match=f"patient pt_2's {volume} chunk fails its checksum"):
        load_cache(path, site=openkbp())
    assert load_cache(path, verify=False, site=openkbp()).patient_ids  # the bytes still load without the check
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    assert "Rebuilding cache" in caplog.text and str(path) in caplog.text and "fails its checksum" in caplog.text
    assert np.array_equal(arrays.dose, expected.dose) and np.array_equal(arrays.ct, expected.ct)


@pytest.mark.parametrize("table", ["voxel_dimensions", "has_dose", "dose_decimals"])
def test_a_flipped_byte_in_a_per_patient_table_fails_its_checksum_and_the_cache_is_rebuilt(phantom_split, tmp_path,
                                                                                           caplog, table):
    cache_dir = tmp_path / "c"
    expected = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    path = cache_path_for(phantom_split, cache_dir, site=openkbp())
    flip_a_table_byte(path, table, 1)
    with pytest.raises(CacheError, match=f"{path}: the {table} table fails its checksum"):
        load_cache(path, site=openkbp())
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    assert "Rebuilding cache" in caplog.text and f"the {table} table fails its checksum" in caplog.text
    assert np.array_equal(getattr(arrays, table), getattr(expected, table))


def test_a_flipped_table_byte_is_found_before_the_volumes_are_mapped(phantom_split, tmp_path, caplog):
    load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    path = cache_path_for(phantom_split, tmp_path / "c", site=openkbp())
    flip_a_table_byte(path, "has_dose", 2)  # would leave pt_3 out of scoring
    with caplog.at_level(logging.WARNING):
        mapped = load_split(phantom_split, cache_dir=tmp_path / "c", require_dose=False, memory_map=True,
                            site=openkbp())
    assert "the has_dose table fails its checksum" in caplog.text and mapped.has_dose.all()


def test_a_cache_written_before_its_tables_were_checksummed_is_rebuilt(phantom_split, tmp_path, caplog):
    import h5py

    expected = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    path = cache_path_for(phantom_split, tmp_path / "c", site=openkbp())
    with h5py.File(path, "r+") as h5:  # as the previous version wrote it
        del h5.attrs["table_checksums"]
        h5.attrs["format_version"] = 4
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    assert "Rebuilding cache" in caplog.text and f"has format 4, expected {CACHE_FORMAT_VERSION}" in caplog.text
    assert np.array_equal(arrays.voxel_dimensions, expected.voxel_dimensions)
    assert np.array_equal(arrays.dose, expected.dose)


def test_each_patient_knows_the_sha256_of_every_file_it_was_read_from(phantom_split, tmp_path):
    """The CT, the possible-dose mask, each structure, the voxel size, the dose and the plan files:
    every file its figures are computed from, by SHA-256 as read, kept by the cache and carried by a
    selection of its patients (what a fold records it trained on); mapped volumes know them too."""
    import hashlib

    (phantom_split / "pt_2" / "beams.csv").write_text("type,gantry_start,gantry_stop,direction,couch\nstatic,0,,,0\n")
    (phantom_split / "pt_2" / "notes.txt").write_text("not read")
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    for pid, files in arrays.sources_of().items():
        folder = phantom_split / pid
        read = sorted(path.name for path in folder.iterdir() if path.suffix == ".csv")
        assert sorted(files) == read and "notes.txt" not in files and "ct.csv" in files and "dose.csv" in files
        assert files == {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in read}
    assert "beams.csv" in arrays.sources_of()["pt_2"]
    assert arrays.select([2, 0]).sources_of() == {pid: arrays.sources_of()[pid] for pid in ("pt_3", "pt_1")}
    mapped = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp(), memory_map=True)
    assert mapped.sources_of() == arrays.sources_of()


def test_build_killed_midway_leaves_no_valid_looking_cache(phantom_split, tmp_path):
    cache_dir = tmp_path / "c"
    script = textwrap.dedent(f"""
        import os, signal
        from provided_code.data.cache import load_split
        from provided_code.sites import openkbp
        def progress(items, length, label):
            for done, item in enumerate(items):
                if done == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield item
        load_split({str(phantom_split)!r}, cache_dir={str(cache_dir)!r}, workers=1, progress=progress, site=openkbp())
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -signal.SIGKILL
    path = cache_path_for(phantom_split, cache_dir, site=openkbp())
    assert not path.exists()
    assert any(name.endswith(".tmp") for name in _files(cache_dir))  # the half-written temp file
    arrays = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    assert len(arrays) == 3 and path.exists()
    assert _files(cache_dir) == [path.name]  # the next build removed what the killed one left


def test_a_cache_is_read_while_the_writer_that_moved_it_in_still_holds_its_lock(phantom_split, tmp_path):
    """Two runs rebuilding one stale cache at once: one's file is moved into place while that
    writer still holds its temporary's lock (until just after the move); the other, reading the
    cache in that instant, reads it (a cache file is replaced whole, never written in place, so a
    reader needs no lock), rather than failing on HDF5's own file lock (errno 11)."""
    import fcntl

    cache_dir = tmp_path / "c"
    load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())
    path = cache_path_for(phantom_split, cache_dir, site=openkbp())
    with open(path, "rb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # as held_atomic_path holds it until just after the move
        assert len(load_cache(path, site=openkbp())) == 3
        assert len(load_cache(path, site=openkbp(), mapped=True)) == 3



def test_a_build_still_running_keeps_its_temporary_file_while_another_builds(phantom_split, tmp_path):
    """Two builds of one cache at once (two runs started together): the second tidies what dead
    builds left, never the first's temporary file, and both end with the cache in place."""
    cache_dir, paused, go = tmp_path / "c", tmp_path / "paused", tmp_path / "go"
    script = textwrap.dedent(f"""
        import pathlib, time
        from provided_code.data.cache import load_split
        from provided_code.sites import openkbp
        def progress(items, length, label):
            for done, item in enumerate(items):
                if done == 1:
                    pathlib.Path({str(paused)!r}).touch()
                    deadline = time.monotonic() + 120
                    while not pathlib.Path({str(go)!r}).exists() and time.monotonic() < deadline:
                        time.sleep(0.05)
                yield item
        load_split({str(phantom_split)!r}, cache_dir={str(cache_dir)!r}, workers=1, progress=progress, site=openkbp())
    """)
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not paused.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert paused.exists(), first.communicate()[0].decode(errors="replace")
        (writing,) = [name for name in _files(cache_dir) if name.endswith(".tmp")]
        arrays = load_split(phantom_split, cache_dir=cache_dir, workers=1, site=openkbp())  # builds meanwhile
        assert len(arrays) == 3 and writing in _files(cache_dir)  # the live build's file is left alone
    finally:
        go.touch()
        output = first.communicate(timeout=120)[0].decode(errors="replace")
    assert first.returncode == 0, output
    assert _files(cache_dir) == [cache_path_for(phantom_split, cache_dir, site=openkbp()).name]


def test_bad_patient_leaves_no_cache_behind(phantom_split, tmp_path):
    (phantom_split / "pt_3" / "ct.csv").unlink()
    cache_dir = tmp_path / "c"
    with pytest.raises(PatientDataError, match=r"Patient pt_3: .*ct\.csv: file is missing"):
        load_split(phantom_split, cache_dir=cache_dir, workers=2, site=openkbp())
    assert _files(cache_dir) == []


def test_missing_dose_is_an_error_when_training_only(phantom_split, tmp_path):
    (phantom_split / "pt_1" / "dose.csv").unlink()
    with pytest.raises(PatientDataError, match=r"Patient pt_1: .*dose\.csv: file is missing"):
        load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", require_dose=False, workers=1, site=openkbp())
    assert arrays.has_dose.tolist() == [False, True, True]
    assert not arrays.dose[0].any()


def test_skip_incomplete_reports_what_it_skipped(phantom_split, tmp_path, caplog):
    (phantom_split / "pt_1" / "possible_dose_mask.csv").unlink()
    (phantom_split / "pt_3" / "dose.csv").unlink()
    with caplog.at_level(logging.WARNING):
        arrays = load_split(phantom_split, cache_dir=tmp_path / "c", skip_incomplete=True, workers=1, site=openkbp())
    assert arrays.patient_ids == ["pt_2"]
    assert set(arrays.skipped) == {"pt_1", "pt_3"}
    assert "Skipped 2 incomplete patient(s)" in caplog.text
    assert "possible_dose_mask.csv: file is missing" in caplog.text and "dose.csv is missing" in caplog.text


def test_a_patient_left_out_anyway_does_not_stop_the_read_and_a_cache_without_it_is_not_reused(phantom_split,
                                                                                                  tmp_path):
    shutil.copy(phantom_split / "pt_1" / "dose.csv", phantom_split / "pt_2" / "dose.csv")  # another patient's plan
    arrays = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp(), leave_out={"pt_2"})
    assert arrays.patient_ids == ["pt_1", "pt_3"]
    assert list(arrays.skipped) == ["pt_2"] and "outside the possible-dose mask" in arrays.skipped["pt_2"]
    with pytest.raises(PatientDataError, match=r"^Patient pt_2: .*dose\.csv: the dose is non-zero in"):
        load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())  # the cache lacks pt_2: rebuilt


def test_a_patient_left_out_anyway_whose_files_cannot_be_read_is_said_once_at_info(phantom_split, tmp_path, caplog):
    shutil.copy(phantom_split / "pt_1" / "dose.csv", phantom_split / "pt_2" / "dose.csv")  # another patient's plan
    with caplog.at_level(logging.INFO, logger="provided_code"):
        load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp(), leave_out={"pt_2"})
    said = [r for r in caplog.records if "pt_2" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"]
    assert re.search(r"left out by --exclude, their files not read: pt_2 \(dose\.csv: the dose is non-zero in",
                     said[0].getMessage())


def test_cache_dir_inside_the_data_is_refused_in_one_line_leaving_nothing(phantom_split):
    with pytest.raises(UserError, match="outside the data") as caught:  # a user's mistake: no traceback
        load_split(phantom_split, cache_dir=phantom_split / "cache", workers=1, site=openkbp())
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)
    assert f"cache_dir={phantom_split / 'cache'}" in str(caught.value)
    assert _files(phantom_split) == ["pt_1", "pt_2", "pt_3"]  # the refused folder was not made


@requires_sample
def test_skip_incomplete_on_the_real_broken_patients(tmp_path):
    # pt_8 lacks ct.csv, pt_38 lacks possible_dose_mask.csv and dose.csv: nothing is left.
    with pytest.raises(PatientDataError, match="no complete patient"):
        load_split(SAMPLE_DIR / "broken", cache_dir=tmp_path / "c", skip_incomplete=True, workers=1, site=openkbp())
    # Beside complete patients, the broken ones are skipped and named.
    mixed = tmp_path / "mixed"
    for source in [SAMPLE_DIR / "broken" / "pt_8", SAMPLE_DIR / "train-pats" / "pt_9", SAMPLE_DIR / "broken" / "pt_38"]:
        shutil.copytree(source, mixed / source.name)
    arrays = load_split(mixed, cache_dir=tmp_path / "c", skip_incomplete=True, workers=2, site=openkbp())
    assert arrays.patient_ids == ["pt_9"]
    assert arrays.skipped == {"pt_8": "ct.csv: file is missing",
                              "pt_38": "possible_dose_mask.csv: file is missing"}


@SLOW_FOR_ITS_TIME
@requires_sample
@pytest.mark.parametrize("split", ["train-pats", "validation-pats"])
def test_real_round_trip_csv_cache_arrays_csv(tmp_path, split):
    """CSV -> cache -> arrays -> CSV gives the same sparse entries (CT after clipping)."""
    arrays = load_split(SAMPLE_DIR / split, cache_dir=tmp_path / "c", site=openkbp())
    assert len(arrays) == {"train-pats": 20, "validation-pats": 6}[split]
    out = tmp_path / "out"
    for row, pid in enumerate(arrays.patient_ids):
        source = SAMPLE_DIR / split / pid

        def original(name):
            return pd.read_csv(source / name, index_col=0)

        ct = original("ct.csv")
        flat_ct = arrays.ct[row].reshape(-1)
        write_sparse_csv(out / "ct.csv", np.flatnonzero(flat_ct), flat_ct[flat_ct != 0])
        again = pd.read_csv(out / "ct.csv", index_col=0)
        assert np.array_equal(again.index, ct.index)
        assert np.array_equal(again["data"], np.clip(ct["data"], 0, CT_MAX))

        write_dose_csv(out / "dose.csv", arrays.dose[row], arrays.possible_dose_mask[row])
        dose, again = original("dose.csv"), pd.read_csv(out / "dose.csv", index_col=0)
        assert np.array_equal(again.index, dose.index)
        assert np.array_equal(again["data"].to_numpy(), dose["data"].to_numpy())  # exact, as text

        assert np.array_equal(np.flatnonzero(arrays.possible_dose_mask[row]),
                              original("possible_dose_mask.csv").index)
        for bit, name in enumerate(STRUCTURES):
            indices = np.flatnonzero(arrays.structure_masks[row].reshape(-1) & (1 << bit))
            expected = np.sort(original(f"{name}.csv").index) if (source / f"{name}.csv").exists() else []
            assert np.array_equal(indices, expected), (pid, name)
            assert arrays.structure_present[row, bit] == (len(expected) > 0)
        assert np.array_equal(arrays.voxel_dimensions[row], np.loadtxt(source / "voxel_dimensions.csv"))
    shutil.rmtree(out)


def test_a_cache_built_before_doses_were_checked_is_rebuilt_and_the_bad_dose_refused(phantom_split, tmp_path,
                                                                                     monkeypatch, caplog):
    import provided_code.data.cache as cache
    import provided_code.data.csv_io as csv_io

    (phantom_split / "pt_2" / "dose.csv").write_text(",data\n")  # a header only: was cached as a zero dose
    with monkeypatch.context() as earlier:  # the cache as the version before the check built it
        earlier.setattr(cache, "CACHE_FORMAT_VERSION", 3)
        earlier.setattr(csv_io, "_check_dose", lambda *args: None, raising=False)
        assert load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp()).has_dose.all()
    with caplog.at_level(logging.WARNING), pytest.raises(
            PatientDataError, match=r"Patient pt_2: .*pt_2/dose\.csv: lists no voxel \(a header only\)"):
        load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    assert "has format 3, expected" in caplog.text
