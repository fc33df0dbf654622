import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from provided_code.data.cache import cache_path_for, load_split
from provided_code.data.chunks import CacheError
from provided_code.data.mapped import derived_path, downsampled
from provided_code.data.resample import downsample_split
from provided_code.data.split_arrays import VOLUME_NAMES
from provided_code.sites import openkbp
from tests.kit.cache_files import flip_a_byte


def test_mapped_volumes_equal_the_arrays_in_memory(phantom_split, tmp_path):
    in_memory = load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    mapped = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp())
    assert mapped.memory_mapped and not in_memory.memory_mapped
    assert mapped.patient_ids == in_memory.patient_ids
    for name in VOLUME_NAMES:
        volume, expected = getattr(mapped, name), getattr(in_memory, name)
        assert volume.shape == expected.shape and volume.dtype == expected.dtype and len(volume) == 3
        assert np.array_equal(volume[np.array([2, 0, 2])], expected[[2, 0, 2]])
        assert np.array_equal(volume[1], expected[1]) and not volume[1].flags.writeable  # a view of the file
        assert np.array_equal(volume[1:], expected[1:])
        assert np.array_equal(volume[1, 5:9, 60], expected[1, 5:9, 60])
    subset = mapped.select(np.array([2, 0]))
    assert subset.memory_mapped and subset.patient_ids == ["pt_3", "pt_1"]
    assert np.array_equal(subset.dose[[1]], in_memory.dose[[0]])


def test_a_fancy_index_reads_and_verifies_only_its_patients(phantom_split, tmp_path):
    load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())  # built
    mapped = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp())
    assert all(len(getattr(mapped, name).verified_rows()) == 0 for name in VOLUME_NAMES)  # nothing read
    mapped.ct[[2]]
    mapped.dose[np.array([0, 2])]
    assert mapped.ct.verified_rows().tolist() == [2]
    assert mapped.dose.verified_rows().tolist() == [0, 2]
    assert len(mapped.structure_masks.verified_rows()) == 0


def test_a_chunk_corrupted_on_disk_is_reported_on_first_touch_naming_file_patient_and_volume(phantom_split, tmp_path):
    load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    path = cache_path_for(phantom_split, tmp_path / "c", site=openkbp())
    flip_a_byte(path, "dose", 1)
    mapped = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True,
                        site=openkbp())  # opens: nothing checked yet
    mapped.dose[[0, 2]]
    mapped.ct[[1]]  # another volume of the same patient is intact
    with pytest.raises(CacheError, match=f"{path}: patient pt_2's dose chunk fails its checksum"):
        mapped.dose[np.array([2, 1])]
    with pytest.raises(CacheError, match="pt_2's dose chunk"):
        mapped.dose[1]  # a view too
    assert not path.exists()  # removed: the next run rebuilds it
    rebuilt = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp())
    in_memory = load_split(phantom_split, cache_dir=tmp_path / "c", site=openkbp())
    assert np.array_equal(rebuilt.dose[[1]], in_memory.dose[[1]])


def test_a_truncated_cache_is_rebuilt_before_it_is_mapped(phantom_split, tmp_path, caplog):
    load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    path = cache_path_for(phantom_split, tmp_path / "c", site=openkbp())
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size - 4096)
    mapped = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp())
    assert "Rebuilding cache" in caplog.text
    assert mapped.ct[[2]].shape == (1, 128, 128, 128)


def test_the_downsampled_file_holds_what_memory_holds_and_is_written_once(phantom_split, tmp_path):
    in_memory = downsample_split(load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp()), 32)
    mapped = downsampled(load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp()), 32)
    path = derived_path(cache_path_for(phantom_split, tmp_path / "c", site=openkbp()), 32)
    assert mapped.ct.path == path and mapped.resolution == 32
    for name in VOLUME_NAMES:
        assert getattr(mapped, name).dtype == getattr(in_memory, name).dtype
        assert np.array_equal(getattr(mapped, name)[:], getattr(in_memory, name))
    written = path.stat().st_mtime_ns
    again = downsampled(load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp()), 32)
    assert path.stat().st_mtime_ns == written and np.array_equal(again.dose[[1]], in_memory.dose[[1]])
    # other patients (a subset): rewritten for them
    mapped = load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp())
    fewer = downsampled(mapped.select([2]), 32)
    assert np.array_equal(fewer.ct[[0]], in_memory.ct[[2]])


def test_a_killed_write_of_the_downsampled_file_leaves_a_temporary_the_next_write_removes(phantom_split, tmp_path):
    load_split(phantom_split, cache_dir=tmp_path / "c", workers=1, site=openkbp())
    script = textwrap.dedent(f"""
        import os, signal
        import provided_code.data.mapped as mapped
        from provided_code.data.cache import load_split
        from provided_code.sites import openkbp
        written = []
        def downsample_patient(*volumes):
            if len(written) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            written.append(1)
            return downsample(*volumes)
        downsample, mapped.downsample_patient = mapped.downsample_patient, downsample_patient
        mapped.downsampled(load_split({str(phantom_split)!r}, cache_dir={str(tmp_path / "c")!r}, memory_map=True,
                                      site=openkbp()), 32)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -signal.SIGKILL, result.stderr.decode(errors="replace")
    source = cache_path_for(phantom_split, tmp_path / "c", site=openkbp())
    path = derived_path(source, 32)
    assert not path.exists() and [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.")]
    downsampled(load_split(phantom_split, cache_dir=tmp_path / "c", memory_map=True, site=openkbp()), 32)
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([source.name, path.name])

