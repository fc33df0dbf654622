"""Models and training runs for the tests: Keras's global state reset between models, a run
trained once per test run (and a copy of it to change), its predictions and its log, and the
network settings to build a model without a run."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from tests.kit.made_once import made_once


def forget_models() -> None:
    """Keras's global dtype policy back to float32 and its session cleared, then what survives that
    full collection frozen: the next ``clear_session`` (the tests', ``predict_stage``'s) walks only
    what came after (see ``pytest_collection_finish`` in ``tests/conftest.py``). What pytest still
    holds at teardown is frozen too (a failed test's traceback and models): a failing run keeps more
    memory."""
    import gc

    import keras

    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()
    gc.freeze()


# The body the tests that do not test the body train and build: --preset v2's generator, its dropout
# and rate (the defaults before the residual U-Net's comparison), a third to a half of the residual
# U-Net's step time at the tests' shapes. The tests of the body, and of what depends on it, ask for
# the residual U-Net by name (docs/development.md lists them).
def _light_body() -> dict:
    from provided_code.presets import PRESETS

    return {name: PRESETS["v2"][name] for name in ("arch", "dropout", "learning_rate")}


LIGHT_BODY = _light_body()
LIGHT_FLAGS = tuple(word for name, value in LIGHT_BODY.items()  # the same as flags, before a test's own flags
                    for word in (f"--{name.replace('_', '-')}", str(value)))


def model_spec(**fields):
    """The :class:`~provided_code.model_spec.ModelSpec` of ``TrainConfig``'s default network (OpenKBP's
    site and nine beams, 64 filters at 128³) on the tests' light body (``LIGHT_BODY``), with ``fields``
    changed: any resolution (16³ too), as tests build it. Another ``arch`` comes with its own widths
    and head unless ``fields`` names them."""
    import dataclasses

    from provided_code.config import TrainConfig

    body = {"widths": (), "head": ""} if "arch" in fields else {}
    return dataclasses.replace(TrainConfig(**LIGHT_BODY).spec, **{**body, **fields})


def trained_once(tmp_path_factory, name: str, config_in, before=None, after=None):
    """The TrainConfig ``config_in(folder)`` with its run trained once for the whole test run (in
    the folder :func:`~tests.kit.made_once.made_once` makes under ``name``; ``before(folder)``
    first, to write its data; ``after(config)`` last, to predict with it). Read-only, as
    ``made_once``'s material is: a test that changes the run changes a copy (:func:`copy_of_run`)."""
    from provided_code.training.train import train

    def make(folder):
        if before is not None:
            before(folder)
        train(config_in(folder))
        if after is not None:
            after(config_in(folder))
        forget_models()

    return config_in(made_once(tmp_path_factory, name, make))


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


def rewrite_commissioning_file(model_dir: Path, name: str, content: dict) -> None:
    """For a test that needs a commissioned model's ``bands.json`` or ``cohort.json`` to say
    something else (a cohort that flags every patient): the file rewritten and its SHA-256 bound
    again in the model card, as a commissioning that had computed it would have written both (a
    file edited by hand alone is refused when read: provided_code/trust.py)."""
    import hashlib
    import json

    from provided_code.trust import BOUND, CARD_FILE, commissioning_folder

    folder = commissioning_folder(model_dir)
    data = json.dumps(content).encode()
    (folder / name).write_bytes(data)
    card = json.loads((folder / CARD_FILE).read_text())
    card[BOUND][name] = hashlib.sha256(data).hexdigest()
    (folder / CARD_FILE).write_text(json.dumps(card))
