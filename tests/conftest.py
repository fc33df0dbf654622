"""The suite's fixtures and pytest hooks; their machinery, and the helpers tests import, are in the
shared test kit (``tests/kit/``).

The suite's time goes to TensorFlow starts and training runs (each run traces its step: seconds).
Material made once per test run and shared by the xdist workers (``tests.kit.made_once``): the
phantoms (``phantom_data``, copied by ``phantom_split``; ``prostate_data``), their cache
(``phantom_cache``: a run of a test's own finds it with ``tests.kit.cache_files.linked_cache``), and
trained runs (``tests.kit.runs.trained_once``; ``tiny_model``, ``two_epoch_run``, ``prostate_model``),
read-only, copied by a test that changes one (``tests.kit.runs.copy_of_run``). A run on one device needs no
process of its own (``CliRunner`` runs the command line in the test's process)."""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

from provided_code.infra.environment import configure_tensorflow

# Two pytest workers share the machine's two cores with the processes the tests start: each TensorFlow
# process computes on one thread, so that they do not oversubscribe the cores (a waiting pool thread
# spins, and runs in lockstep, replicas or workers, stall while one of them has no core). Measured on
# the whole suite: a sixth less processor time, and the multi-worker test in 24 s instead of 41.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
configure_tensorflow()  # oneDNN CPU kernels for every test and the processes tests start (before TensorFlow loads)

from provided_code.data.phantoms import OWN_PLAN_EVERY, write_phantom_split, write_prostate_phantom_split  # noqa: E402
from tests.kit.made_once import leave_only, made_once, made_once_in_parts  # noqa: E402
from tests.kit.ordering import slow_first  # noqa: E402
from tests.kit.tiers import heavy_calls_allowed, heavy_calls_refused, unmarked_users_of_training_fixtures  # noqa: E402
from tests.kit.runs import LIGHT_BODY, LIGHT_FLAGS, forget_models, trained_once  # noqa: E402
from provided_code.sites import load_site, openkbp  # noqa: E402

# The phantom patients of phantom_data and prostate_data: (split, patient number)
PHANTOM_PATIENTS = [("train-pats", number) for number in range(1, 5)] + [("validation-pats", number) for number in (201, 202)]

# 5 epochs of 4 steps: on these phantoms the masked loss fell by a quarter (3.62 to 2.73) before sites existed
PROSTATE_RUN = (*LIGHT_FLAGS, "--site", "prostate", "--filters", "4", "--resolution", "32", "--xla", "off", "--epochs", "5",
                "--batch-size", "1", "--learning-rate", "3e-3", "--lr-schedule", "constant", "--loss", "masked-mae",
                "--score-every", "0", "--save-every", "1")


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


@pytest.fixture(scope="session")
def phantom_data(tmp_path_factory) -> Path:
    """A read-only data folder: train-pats/ (4 phantoms) and validation-pats/ (2 phantoms), as
    ``write_phantom_split`` writes them (patient N from seed N); the workers write them together."""
    return made_once_in_parts(tmp_path_factory, "phantom-data", {
        f"{split}/pt_{number}": functools.partial(lambda number, folder: write_phantom_split(
            folder.parent, 1, first_number=number), number) for split, number in PHANTOM_PATIENTS})


@pytest.fixture(scope="session")
def phantom_cache(phantom_data, tmp_path_factory) -> Path:
    """The cache folder of ``phantom_data``'s two splits, built once per test run. Read-only: a test
    that trains on ``phantom_data`` with a cache folder of its own fills it with ``linked_cache``."""
    from provided_code.data.cache import load_split

    def make(folder):
        for split in ("train-pats", "validation-pats"):
            load_split(phantom_data / split, cache_dir=folder, require_dose=False, workers=1, site=openkbp())

    return made_once(tmp_path_factory, "phantom-cache", make)


@pytest.fixture(scope="session")
def tiny_model(phantom_data, phantom_cache, tmp_path_factory) -> Path:
    """The run folder (``results/m``) of a model trained once per test run on ``phantom_data``:
    4 filters, 32³, one epoch, no scoring. To read and predict with, not to change."""
    from provided_code.config import TrainConfig

    return trained_once(tmp_path_factory, "tiny-model", lambda root: TrainConfig(
        **LIGHT_BODY, filters=4, resolution=32, epochs=1, xla="off", score_every=0, data_dir=str(phantom_data),
        results_dir=str(root / "results"), model_name="m", cache_dir=str(phantom_cache))).run_dir


@pytest.fixture(scope="session")
def two_epoch_run(phantom_data, tmp_path_factory):
    """The TrainConfig of a run trained once per test run: two epochs on the phantoms (a checkpoint
    after each, scored at the last only: epoch 2 is also the best), with two test patients (the
    validation ones without their doses), its validation and test predictions written. Read-only:
    copy it (``tests.kit.runs.copy_of_run``, or its ``run_dir``); its data (links to phantom_data's
    files) and cache are shared (all three splits cached first). tests/test_predict.py predicts
    with it; tests/test_train.py resumes it (the recipe of its ``config``, other cadences)."""
    from provided_code.config import TrainConfig
    from provided_code.data.cache import load_split
    from tests.kit.runs import predict

    def config_in(root):
        return TrainConfig(**LIGHT_BODY, filters=4, resolution=32, epochs=2, save_every=1, xla="off",
                           data_dir=str(root / "data"),
                           results_dir=str(root / "results"), model_name="m", cache_dir=str(root / "cache"))

    def write_data(root):
        shutil.copytree(phantom_data, root / "data", copy_function=os.link)  # read-only: links
        for number, source in ((241, "pt_201"), (242, "pt_202")):  # test patients: the validation ones without a dose
            shutil.copytree(phantom_data / "validation-pats" / source, root / "data" / "test-pats" / f"pt_{number}",
                            copy_function=os.link, ignore=lambda folder, names: ["dose.csv"])
        for split in ("train-pats", "validation-pats", "test-pats"):
            load_split(root / "data" / split, cache_dir=root / "cache", require_dose=False, workers=1, site=openkbp())

    def write_predictions(config):
        for stage in ("validation", "test"):
            predict(config, stage=stage)

    return trained_once(tmp_path_factory, "two-epoch-run", config_in, before=write_data, after=write_predictions)


@pytest.fixture(scope="session")
def prostate_data(tmp_path_factory) -> Path:
    """A read-only prostate data folder: train-pats/ (4 phantoms; pt_4 with a plan of its own,
    beams.csv and prescriptions.csv) and validation-pats/ (2 phantoms), as
    ``write_prostate_phantom_split`` writes them; the workers write them together."""
    return made_once_in_parts(tmp_path_factory, "prostate-data", {
        f"{split}/pt_{number}": functools.partial(lambda number, folder: write_prostate_phantom_split(
            folder.parent, 1, first_number=number, own_plan_every=OWN_PLAN_EVERY, site=load_site("prostate")), number)
        for split, number in PHANTOM_PATIENTS})


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

    return made_once(tmp_path_factory, "prostate-model", make) / "results" / "p"


# A cross-validated model: 2 folds of phantom_data's 4 training phantoms, one epoch each, scored
CV_RUN = (*LIGHT_FLAGS, "--folds", "2", "--filters", "4", "--resolution", "32", "--xla", "off", "--epochs", "1", "--score-every", "1",
          "--model-name", "cv")


@pytest.fixture(scope="session")
def cv_model(phantom_data, phantom_cache, tmp_path_factory) -> Path:
    """The model folder (``results/cv``) of a cross-validated model trained once per test run by
    the command line (``CV_RUN`` on ``phantom_data``, ``--fold 1`` then ``--fold 2``): its
    ``splits.json``, ``fold-1/`` and ``fold-2/`` with their out-of-fold predictions. To read, not
    to change (copy it)."""
    from click.testing import CliRunner

    import provided_code.apps.cli as cli

    def make(root):
        for fold in ("1", "2"):
            result = CliRunner().invoke(cli.main, [*CV_RUN, "--fold", fold, "--data-dir", str(phantom_data),
                                                   "--results-dir", str(root / "results"), "--cache-dir",
                                                   str(phantom_cache)])
            forget_models()
            if result.exit_code != 0:
                raise RuntimeError(f"fold {fold} failed:\n{result.output}")

    return made_once(tmp_path_factory, "cv-model", make) / "results" / "cv"


@pytest.fixture(scope="session")
def commissioned_cv(cv_model, phantom_data, phantom_cache, tmp_path_factory) -> Path:
    """A copy of ``cv_model`` (``results/cv``) whose folds predicted the validation phantoms together
    (``--predict-only --ensemble cv``), then commissioned (``openkbp-commission``): its
    ``commissioning/`` with bands.json, cohort.json and the report's calibration. Made once per test
    run; to read, not to change (copy it)."""
    from provided_code.apps.commission.run import commission
    from provided_code.apps.predict import predict_stage

    def make(root):
        model = root / "results" / "cv"
        shutil.copytree(cv_model, model)
        predict_stage(model, phantom_data, stage="validation", ensemble=["cv"], cache_dir=phantom_cache)
        forget_models()
        commission(model, data_dir=phantom_data, cache_dir=phantom_cache)

    return made_once(tmp_path_factory, "commissioned-cv", make) / "results" / "cv"


@pytest.fixture
def phantom_split(tmp_path, phantom_data) -> Path:
    """A writable split of 3 phantoms (pt_1, pt_2, pt_3: copies of ``phantom_data``'s first three
    training patients), for tests that break files."""
    return Path(shutil.copytree(phantom_data / "train-pats", tmp_path / "split", ignore=lambda folder, names: [
        name for name in names if name.startswith("pt_") and name not in ("pt_1", "pt_2", "pt_3")]))


def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="FILE", default=None,
                     help="write each test's processor time, its own and its processes', to FILE as JSON lines; "
                          "spelt --cpu-times=FILE (a separate FILE is taken for a path to test) "
                          "(tests.kit.cpu_times)")


def pytest_configure(config):
    path = config.getoption("--cpu-times")
    if path:
        from tests.kit.cpu_times import CpuTimes

        worker = hasattr(config, "workerinput")  # a pytest-xdist worker's: the controller empties the file
        config.pluginmanager.register(CpuTimes(path, fresh=not worker), "cpu-times")


def pytest_collection_modifyitems(items):
    """A test not marked slow that uses a fixture that trains is an error (``tests.kit.tiers``); the
    slow tests first on every worker, so that the workers finish together (``slow_first`` says how
    it deals them out to worksteal's workers)."""
    unmarked = unmarked_users_of_training_fixtures(items)
    if unmarked:
        raise pytest.UsageError("Tests that train outside the slow tier:\n" + "\n".join(unmarked))
    items[:] = slow_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """A test not marked slow may not train, load a trained model or run a Python process that loads
    TensorFlow, in its setup (the session's trained fixtures are made there), its call or its
    teardown (``tests.kit.tiers``). Each phase is guarded on its own, and its end puts back what it
    found: a test's monkeypatch of a guarded function, undone at teardown, puts back the guard's."""
    with _quick_tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _quick_tier_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _quick_tier_guard(item):
        return (yield)


def _quick_tier_guard(item):
    if item.get_closest_marker("slow") is not None:
        return heavy_calls_allowed()  # even in a suite that a quick test runs (tests/test_tiers.py)
    return heavy_calls_refused(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's folder (``tmp_path``) is kept at the run's end (``pytest_sessionfinish``)."""
    report = yield
    if report.failed and "tmp_path" in getattr(item, "funcargs", {}):
        item.config.stash.setdefault(_FAILED_FOLDERS, set()).add(item.funcargs["tmp_path"])
    return report


_FAILED_FOLDERS = pytest.StashKey[set]()


def pytest_sessionfinish(session):
    """The run's temporary folder emptied but for the failed tests' folders (``leave_only``): in each
    pytest-xdist worker its own folder, then in the controller (or a run without workers) the folder
    the workers share, with the material made once for all (``made_once``)."""
    factory = getattr(session.config, "_tmp_path_factory", None)  # pytest's; no public way to its folder
    base = getattr(factory, "_basetemp", None)  # None: no test asked for a temporary folder
    if base is not None:
        leave_only(base, session.config.stash.get(_FAILED_FOLDERS, set()),
                   workers=not os.environ.get("PYTEST_XDIST_WORKER"))


def pytest_collection_finish(session):
    """Every object alive once the tests are collected (TensorFlow, Keras, the test modules: about
    350,000) moved out of the garbage collector's sight: Keras's ``clear_session``, which the tests
    and ``predict_stage`` call after each model, runs a full collection, which otherwise walks them
    all each time (a tenth of a second and more, a hundred times a run). They are still freed by
    reference counting; only cycles among them would wait for the process's end."""
    import gc

    gc.collect()
    gc.freeze()
