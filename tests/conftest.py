"""Shared fixtures: the real OpenKBP sample (skipped when absent) and synthetic phantom splits.

The suite's time goes to TensorFlow starts and training runs (each run traces its step: seconds).
Material made once per test run and shared by the xdist workers (:func:`_made_once`): the phantoms
(``phantom_data``, copied by ``phantom_split``), their cache (``phantom_cache``: a run of a test's
own finds it with :func:`linked_cache`), and trained runs (:func:`trained_once`; ``tiny_model``),
read-only, copied by a test that changes one (:func:`copy_of_run`). A run on one device needs no
process of its own (``CliRunner`` runs the command line in the test's process)."""

from __future__ import annotations

import csv
import functools
import os
import shutil
import sys
from pathlib import Path

import pytest

from provided_code.infra.environment import configure_tensorflow, cpu_flags

# Two pytest workers share the machine's two cores with the processes the tests start: each TensorFlow
# process computes on one thread, so that they do not oversubscribe the cores (a waiting pool thread
# spins, and runs in lockstep, replicas or workers, stall while one of them has no core). Measured on
# the whole suite: a sixth less processor time, and the multi-worker test in 24 s instead of 41.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
configure_tensorflow()  # oneDNN CPU kernels for every test and the processes tests start (before TensorFlow loads)

from provided_code.data.phantoms import write_phantom_split, write_prostate_phantom_split  # noqa: E402
from provided_code.sites import load_site, openkbp  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE_DIR = Path(os.environ.get("OPENKBP_SAMPLE_DIR", Path(__file__).resolve().parents[2] / "shared" / "openkbp-sample"))

requires_sample = pytest.mark.skipif(
    not (SAMPLE_DIR / "train-pats").is_dir(),
    reason=f"real OpenKBP sample not found at {SAMPLE_DIR} (a fresh clone without ../shared); "
           "the phantom tests cover the same code paths",
)


def _float16_convolutions_unavailable() -> str | None:
    """Why TensorFlow's float16 convolutions fail in this process, or None (they run).

    TensorFlow sends float16 convolutions to oneDNN when the processor's CPUID shows AVX512-FP16 or
    AMX-FP16 (with AVX512BW) or AVX-NE-CONVERT (``IsDataTypeSupportedByOneDNNOnThisCPU``), else to
    its own kernels. ``ONEDNN_MAX_CPU_ISA=AVX2``, set on such a processor to try the suite as an
    AVX2-only machine would run it, caps oneDNN below those instructions while CPUID still shows
    them: oneDNN then has no float16 convolution ("could not create a primitive descriptor"). A real
    AVX2-only processor runs these tests with TensorFlow's own float16 kernels.
    """
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if not cap or cap == "ALL" or "FP16" in cap or "AMX" in cap or "AVX10" in cap or cap == "AVX2_VNNI_2":
        return None
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1").lower() in ("0", "false"):
        return None
    flags = set(cpu_flags())
    if ("avx512bw" in flags and flags & {"avx512_fp16", "amx_fp16"}) or "avx_ne_convert" in flags:
        return (f"ONEDNN_MAX_CPU_ISA={cap} on a processor whose CPUID shows float16 instructions: TensorFlow "
                f"sends float16 convolutions to oneDNN, which the cap leaves without them (an emulation "
                f"artefact; a real {cap} processor runs this test on TensorFlow's own kernels)")
    return None


_FLOAT16_UNAVAILABLE = _float16_convolutions_unavailable()
requires_float16_convolutions = pytest.mark.skipif(_FLOAT16_UNAVAILABLE is not None, reason=str(_FLOAT16_UNAVAILABLE))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    """No test writes to the user's real cache folder."""
    monkeypatch.setenv("OPENKBP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def reset_keras():
    """After the test: Keras's global dtype policy back to float32, its session cleared (for tests
    that build models in this process; use with ``pytestmark = pytest.mark.usefixtures(...)``)."""
    yield
    forget_models()


def forget_models() -> None:
    """Keras's global dtype policy back to float32 and its session cleared, then what survives that
    full collection frozen: the next ``clear_session`` (the tests', ``predict_stage``'s) walks only
    what came after (see :func:`pytest_collection_finish`). What pytest still holds at teardown is
    frozen too (a failed test's traceback and models): a failing run keeps more memory."""
    import gc

    import keras

    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()
    gc.freeze()


def network_config(**fields):
    """The network and optimizer settings of ``TrainConfig``'s defaults, with ``fields`` changed,
    without its checks (so that tests can build at 16³); ``gantry_angles`` and ``site_obj``
    (unless given) resolved as it resolves them."""
    import dataclasses
    import types

    from provided_code.config import TrainConfig
    from provided_code.networks.beams import resolve_beam_angles

    from provided_code.sites import load_site

    settings = {**dataclasses.asdict(TrainConfig()), **fields}
    settings.setdefault("site_obj", load_site(settings["site"]))
    return types.SimpleNamespace(**settings, gantry_angles=resolve_beam_angles(settings["beams"], settings["beam_angles"]))


def console_script(name: str) -> list[str]:
    """The command line that runs the console script ``name`` as setup.cfg declares it, in this
    Python (an installed script may predate a move of its module until the next ``pip install -e``)."""
    import configparser

    parser = configparser.ConfigParser()
    parser.read(REPO / "setup.cfg")
    scripts = dict(line.split(" = ") for line in parser["options.entry_points"]["console_scripts"].strip().splitlines())
    module, function = scripts[name].split(":")
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; {function}()"]


def copy_of_run(trained, tmp_path: Path):
    """For a test that changes a run trained once (:func:`trained_once`): ``trained`` (its TrainConfig)
    with its run folder copied into ``tmp_path/results``; the cache stays shared (it is only read)."""
    import dataclasses

    config = dataclasses.replace(trained, results_dir=str(tmp_path / "results"))
    shutil.copytree(trained.run_dir, config.run_dir)
    return config


def predict(config, **options):
    """``predict_stage`` of the model a TrainConfig trained, with its data, cache and batch size, as
    ``runpod_train.py --predict-only`` passes them."""
    from provided_code.apps.predict import predict_stage

    return predict_stage(config.run_dir, config.data_dir, batch_size=config.batch_size, cache_dir=config.cache_dir,
                         skip_incomplete=config.skip_incomplete, **options)


def log_epochs(run_dir: Path) -> list[int]:
    """The epochs in a run's ``training_log.csv``, in order."""
    with open(Path(run_dir) / "training_log.csv", newline="") as handle:
        return [int(row["epoch"]) for row in csv.DictReader(handle)]


def _shared_base(tmp_path_factory) -> Path:
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # this run's folder, shared by its workers (one per run: never stale)
    return base


def _make_locked(lock_path: Path, folder: Path, made: Path, make, wait: bool = True) -> bool:
    """Under the lock file ``lock_path``, ``make(folder)`` unless ``made`` says it was; False when
    ``wait`` is False and another worker holds the lock (it is making it)."""
    import fcntl

    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that died making it
            make(folder)
            made.touch()
    return True


def _made_once(tmp_path_factory, name: str, make) -> Path:
    """The folder ``name`` that ``make(folder)`` fills once for the whole test run: under pytest-xdist
    the first worker to ask makes it in the folder the workers share, the others wait for it (a lock
    file) and use it too. For read-only material only (phantoms, a trained model to predict with)."""
    base = _shared_base(tmp_path_factory)
    folder = base / name
    _make_locked(base / f"{name}.lock", folder, base / f"{name}.made", make)
    return folder


def _made_once_in_parts(tmp_path_factory, name: str, parts: dict[str, object]) -> Path:
    """:func:`_made_once` for a folder of independent parts (``{subfolder: make(subfolder)}``): the
    workers that ask at once share the making, each taking the parts no other has begun, then
    waiting for the rest."""
    base = _shared_base(tmp_path_factory)
    folder, marks = base / name, base / f"{name}.parts"
    marks.mkdir(exist_ok=True)
    for wait in (False, True):
        for index, (part, make) in enumerate(parts.items()):
            _make_locked(marks / f"{index}.lock", folder / part, marks / f"{index}.made", make, wait=wait)
    return folder


@pytest.fixture(scope="session")
def phantom_data(tmp_path_factory) -> Path:
    """A read-only data folder: train-pats/ (4 phantoms) and validation-pats/ (2 phantoms), as
    ``write_phantom_split`` writes them (patient N from seed N); the workers write them together."""
    patients = [("train-pats", number) for number in range(1, 5)] + [("validation-pats", number) for number in (201, 202)]
    return _made_once_in_parts(tmp_path_factory, "phantom-data", {
        f"{split}/pt_{number}": functools.partial(lambda number, folder: write_phantom_split(
            folder.parent, 1, first_number=number), number) for split, number in patients})


@pytest.fixture(scope="session")
def phantom_cache(phantom_data, tmp_path_factory) -> Path:
    """The cache folder of ``phantom_data``'s two splits, built once per test run. Read-only: a test
    that trains on ``phantom_data`` with a cache folder of its own fills it with :func:`linked_cache`."""
    from provided_code.data.cache import load_split

    def make(folder):
        for split in ("train-pats", "validation-pats"):
            load_split(phantom_data / split, cache_dir=folder, require_dose=False, workers=1, site=openkbp())

    return _made_once(tmp_path_factory, "phantom-cache", make)


def linked_cache(phantom_cache: Path, folder: Path) -> Path:
    """``folder`` with hard links to ``phantom_cache``'s files, so that a run finds ``phantom_data``
    cached rather than parsing its CSVs again (what the cache tests test, not these). A cache that
    is rebuilt replaces its link (a new file moved into place), never the shared file; a test that
    damages a cache file in place damages one of its own (as the mapped 32³ files are), not a link."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in phantom_cache.iterdir():
        if path.suffix == ".h5":
            try:
                os.link(path, folder / path.name)
            except OSError:  # another file system
                shutil.copy2(path, folder / path.name)
    return folder


def trained_once(tmp_path_factory, name: str, config_in, before=None, after=None):
    """The TrainConfig ``config_in(folder)`` with its run trained once for the whole test run (in
    the folder :func:`_made_once` makes under ``name``; ``before(folder)`` first, to write its data;
    ``after(config)`` last, to predict with it). Read-only, as ``_made_once``'s material is: a test
    that changes the run changes a copy (:func:`copy_of_run`)."""
    from provided_code.training.train import train

    def make(folder):
        if before is not None:
            before(folder)
        train(config_in(folder))
        if after is not None:
            after(config_in(folder))
        forget_models()

    return config_in(_made_once(tmp_path_factory, name, make))


@pytest.fixture(scope="session")
def tiny_model(phantom_data, phantom_cache, tmp_path_factory) -> Path:
    """The run folder (``results/m``) of a model trained once per test run on ``phantom_data``:
    4 filters, 32³, one epoch, no scoring. To read and predict with, not to change."""
    from provided_code.config import TrainConfig

    return trained_once(tmp_path_factory, "tiny-model", lambda root: TrainConfig(
        filters=4, resolution=32, epochs=1, xla="off", score_every=0, data_dir=str(phantom_data),
        results_dir=str(root / "results"), model_name="m", cache_dir=str(phantom_cache))).run_dir


@pytest.fixture(scope="session")
def prostate_data(tmp_path_factory) -> Path:
    """A read-only prostate data folder: train-pats/ (4 phantoms; pt_4 with a plan of its own,
    beams.csv and prescriptions.csv) and validation-pats/ (2 phantoms), as
    ``write_prostate_phantom_split`` writes them; the workers write them together."""
    patients = [("train-pats", number) for number in range(1, 5)] + [("validation-pats", number) for number in (201, 202)]
    return _made_once_in_parts(tmp_path_factory, "prostate-data", {
        f"{split}/pt_{number}": functools.partial(lambda number, folder: write_prostate_phantom_split(
            folder.parent, 1, first_number=number, own_plan_every=4, site=load_site("prostate")), number)
        for split, number in patients})


# 5 epochs of 4 steps: on these phantoms the masked loss fell by a quarter (3.62 to 2.73) before sites existed
PROSTATE_RUN = ("--site", "prostate", "--filters", "4", "--resolution", "32", "--xla", "off", "--epochs", "5",
                "--batch-size", "1", "--learning-rate", "3e-3", "--lr-schedule", "constant", "--loss", "masked-mae",
                "--score-every", "0", "--save-every", "1")


@pytest.fixture(scope="session")
def prostate_model(prostate_data, tmp_path_factory) -> Path:
    """The run folder (``results/p``) of a prostate model trained once per test run by the command
    line (``PROSTATE_RUN`` on ``prostate_data``). To read and predict with, not to change."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    def make(root):
        result = CliRunner().invoke(cli.main, [*PROSTATE_RUN, "--data-dir", str(prostate_data), "--results-dir",
                                               str(root / "results"), "--model-name", "p", "--cache-dir",
                                               str(root / "cache")])
        forget_models()
        if result.exit_code != 0:
            raise RuntimeError(f"the prostate run failed:\n{result.output}")

    return _made_once(tmp_path_factory, "prostate-model", make) / "results" / "p"


@pytest.fixture
def phantom_split(tmp_path, phantom_data) -> Path:
    """A writable split of 3 phantoms (pt_1, pt_2, pt_3: copies of ``phantom_data``'s first three
    training patients), for tests that break files."""
    return Path(shutil.copytree(phantom_data / "train-pats", tmp_path / "split", ignore=lambda folder, names: [
        name for name in names if name.startswith("pt_") and name not in ("pt_1", "pt_2", "pt_3")]))


def pytest_collection_modifyitems(items):
    """The slow tests first on every worker (stable otherwise), so that the workers finish together.

    pytest-xdist's worksteal hands each of its n workers one contiguous n-th of this list, and an
    idle worker then steals from the end of another's queue: so the slow tests are dealt to the
    starts of those parts, each part filled up with fast tests, and the last tests left to share
    out are fast ones. (All slow tests at the head of the list would give them all to the first
    worker, and the other only its last ones, stolen late.) They are dealt a module at a time, in
    turn, so that the slow tests sharing a module's trained run (``trained_once``) are on one
    worker, not waiting on each other's."""
    parts = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    modules: dict[str, list] = {}
    for item in items:
        if item.get_closest_marker("slow") is not None:
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = [[] for _ in range(parts)]
    for index, module in enumerate(modules.values()):
        slow[index % parts] += module
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    ordered, remaining = [], len(items)
    for part in range(parts):
        size = remaining // (parts - part)  # as worksteal divides the list among its workers
        filler = max(0, size - len(slow[part]))
        ordered += slow[part] + fast[:filler]
        fast, remaining = fast[filler:], remaining - len(slow[part]) - filler
    items[:] = ordered + fast


def flip_a_byte(path, volume: str, row: int) -> None:
    """Change one byte in the middle of patient ``row``'s ``volume`` chunk, size and time kept."""
    import h5py

    with h5py.File(path, "r") as h5:
        chunk = h5[volume].id.get_chunk_info_by_coord((row, 0, 0, 0))
    position = chunk.byte_offset + chunk.size // 2 + 3
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(position)
        byte = handle.read(1)
        handle.seek(position)
        handle.write(bytes([byte[0] ^ 0x10]))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def pytest_collection_finish(session):
    """Every object alive once the tests are collected (TensorFlow, Keras, the test modules: about
    350,000) moved out of the garbage collector's sight: Keras's ``clear_session``, which the tests
    and ``predict_stage`` call after each model, runs a full collection, which otherwise walks them
    all each time (a tenth of a second and more, a hundred times a run). They are still freed by
    reference counting; only cycles among them would wait for the process's end."""
    import gc

    gc.collect()
    gc.freeze()
