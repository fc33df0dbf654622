"""Before TensorFlow loads: the data is there and every folder a run writes can be written, also
for root, whose writes a plain chmod does not stop (the capability is dropped with setpriv)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provided_code.errors import ConfigError
from provided_code.infra.preflight import check_writable
from tests.kit.cache_files import linked_cache
from tests.kit.repo import REPO
from tests.kit.runs import LIGHT_FLAGS



def test_check_writable_names_the_folder_and_the_reason(tmp_path):
    assert check_writable(tmp_path / "new" / "folder", "results folder").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"Cannot write to the cache folder .*file/cache: Not a directory"):
        check_writable(tmp_path / "file" / "cache", "cache folder")


def _as_unprivileged(args, **kwargs):
    """Run without CAP_DAC_OVERRIDE, so that file permissions bind even for root."""
    setpriv = shutil.which("setpriv")
    prefix = [setpriv, "--bounding-set", "-dac_override,-dac_read_search"] if setpriv else []
    return subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=300, **kwargs)


def _read_only(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o555)
    return folder


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_read_only_results_or_cache_folder_is_one_line_before_tensorflow(phantom_data, tmp_path):
    results = _read_only(tmp_path / "results")
    command = [sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data), *LIGHT_FLAGS, "--filters", "2",
               "--resolution", "32", "--epochs", "1", "--results-dir", str(results), "--cache-dir", str(tmp_path / "c")]
    result = _as_unprivileged(command)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"Cannot write to the results folder (--results-dir, --model-name) {results / 'unet'}: Permission denied" \
        in result.stderr
    assert "Strategy:" not in result.stderr and not (tmp_path / "c").exists()  # stopped before TensorFlow and data

    cache = _read_only(tmp_path / "cache")
    result = _as_unprivileged([*command[:-4], "--results-dir", str(tmp_path / "ok"), "--cache-dir", str(cache)])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"Cannot write to the cache folder (--cache-dir, $OPENKBP_CACHE_DIR) {cache}: Permission denied" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is not installed")
def test_models_folder_made_read_only_mid_run_is_one_line_naming_the_path(phantom_data, phantom_cache, tmp_path):
    import time

    results = tmp_path / "results"
    models = results / "m" / "models"
    setpriv = [shutil.which("setpriv"), "--bounding-set", "-dac_override,-dac_read_search"]
    process = subprocess.Popen([*setpriv, sys.executable, str(REPO / "runpod_train.py"), "--data-dir", str(phantom_data),
                                *LIGHT_FLAGS, "--filters", "2", "--resolution", "32", "--epochs", "200", "--save-every", "1",
                                "--score-every", "0", "--model-name", "m", "--results-dir", str(results),
                                "--cache-dir", str(linked_cache(phantom_cache, tmp_path / "cache"))],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (models / "epoch_1.keras").exists() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        models.chmod(0o555)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
        models.chmod(0o755)
    assert process.returncode == 1 and "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    # the file being written, not its hidden temporary name
    assert last.startswith(f"Error: {models}/epoch_") and last.endswith(": Permission denied"), last
