"""The model folder's lock: a second run is refused while the first lives, allowed once it is killed."""

import signal
import subprocess
import sys
import time

import pytest

from provided_code.config import TrainConfig
from provided_code.errors import RunLockedError
from provided_code.run_folder import LOCK_FILE, RunFolder
from tests.kit.runs import LIGHT_BODY, predict

HOLD = ("import sys, time\nfrom provided_code.run_folder import RunFolder\n"
        "with RunFolder(sys.argv[1]).lock('training'):\n    print('locked', flush=True)\n    time.sleep(120)\n")


def _holder(run_dir):
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def test_second_run_refused_while_the_first_lives_and_allowed_after_sigkill(tmp_path):
    run_dir = tmp_path / "results" / "unet"
    first = _holder(run_dir)
    try:
        with pytest.raises(RunLockedError) as caught:
            with RunFolder(run_dir).lock("training"):
                pass
        message = str(caught.value)
        assert str(run_dir) in message and f"pid {first.pid}" in message and "training since" in message
        assert "\n" not in message
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    with RunFolder(run_dir).lock("--predict-only") as lock:  # a killed holder leaves nothing that blocks
        assert "--predict-only" in (run_dir / LOCK_FILE).read_text()
    with RunFolder(run_dir).lock("training"):  # released on exit
        pass
    assert lock.path == run_dir / LOCK_FILE


def test_training_and_prediction_take_the_lock_before_loading_anything(tmp_path, phantom_data):
    from provided_code.training.train import train

    config = TrainConfig(**LIGHT_BODY, filters=2, resolution=32, epochs=1, xla="off", data_dir=str(phantom_data),
                         results_dir=str(tmp_path / "results"), model_name="m", cache_dir=str(tmp_path / "cache"))
    RunFolder(config.run_dir).models.mkdir(parents=True)
    holder = _holder(config.run_dir)
    try:
        start = time.perf_counter()
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            train(config)
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            predict(config)
        assert time.perf_counter() - start < 5 and not (tmp_path / "cache").exists()  # refused before the data
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_readers_share_the_lock_and_exclude_a_writer_and_the_reverse(tmp_path):
    run_dir = tmp_path / "results" / "member"
    with RunFolder(run_dir).lock("read by the ensemble 'a'", shared=True), \
            RunFolder(run_dir).lock("read by the ensemble 'b'", shared=True):  # two readers at once
        with pytest.raises(RunLockedError, match=r"in use by another run \(pid \d+ on .*, read by the ensemble"):
            with RunFolder(run_dir).lock("training"):
                pass
    with RunFolder(run_dir).lock("training"):
        with pytest.raises(RunLockedError) as caught:
            with RunFolder(run_dir).lock("read by the ensemble 'a'", shared=True):
                pass
    message = str(caught.value)
    assert "training since" in message and message.endswith("wait for it to end before reading it")
    assert "\n" not in message
    with RunFolder(run_dir).lock("read by the ensemble 'a'", shared=True):  # released on exit
        pass


def test_whether_a_lock_is_held_is_asked_without_taking_it(tmp_path, monkeypatch):
    from provided_code.infra import run_lock
    from provided_code.infra.run_lock import RunLock, is_held

    path = tmp_path / ".lock"
    assert is_held(path) is False  # no file: never locked
    with RunLock(path, "a DICOM node"):
        assert is_held(path) is True
    assert is_held(path) is False
    monkeypatch.setattr(run_lock, "LOCKS_TABLE", tmp_path / "no-such-table")
    assert is_held(path) is None  # no table to ask: unknown
