"""The declared model inputs (provided_code/model_spec.py) and the per-patient ones training fits to its
data (training/feeds.py): the network, the data path, the step and prediction read one declaration."""

import dataclasses
import logging
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from provided_code.config import ConfigError, TrainConfig
from provided_code.data.augment import Augmenter
from provided_code.data import batches as batches_module
from provided_code.data.batches import InputError, fit_vectors, patient_vectors, take_inputs
from provided_code.data.cache import load_split
from provided_code.data.patient_plan import write_beams
from provided_code.data.tf_dataset import element_spec, take_element
from provided_code.inference import predict_arrays
from provided_code.model_spec import ANGLES, STRUCTURE_BITS, UNCHANGED, VOLUME, model_inputs
from provided_code.losses import loss_function
from provided_code.sites import load_site, openkbp, site_from_dict
from provided_code.training.feeds import fit_patient_inputs
from provided_code.training.admission import resume
from provided_code.training.model import new_model
from provided_code.training.step import TrainStep
from provided_code.training.train import model_weights
from tests.kit.runs import model_spec
from tests.kit.tiers import SLOW_FOR_ITS_TIME

pytestmark = pytest.mark.usefixtures("reset_keras")
SIZE = 16
OPENKBP = load_site("openkbp")


def wide_site():
    """20 structures (a uint32 packing): 17 organs, two of them a mirror pair in the high bits, and
    three targets in the top bits."""
    organs = [{"name": f"Organ{k}", "kind": "oar"} for k in range(17)]
    targets = [{"name": f"PTV{gy}", "kind": "target", "prescription_gy": gy} for gy in (50, 60, 70)]
    return site_from_dict({"name": "wide", "structures": organs + targets, "mirror_pairs": [["Organ15", "Organ16"]],
                           "beams": {"type": "static", "angles": [0, 90, 180, 270]}}, "test")


class Patients:
    """A stand-in for SplitArrays: random compact volumes at SIZE³, optional per-patient arrays."""

    def __init__(self, count=4, bits=10, dtype=np.uint16, seed=0, **fields):
        rng = np.random.default_rng(seed)
        shape = (count, SIZE, SIZE, SIZE)
        self.patient_ids = [f"pt_{n + 1}" for n in range(count)]
        self.ct = rng.integers(0, 4096, shape).astype(np.uint16)
        self.structure_masks = rng.integers(0, 2 ** bits, shape, dtype=np.uint64).astype(dtype)
        self.dose = rng.uniform(0, 70, shape).astype(np.float32)
        self.possible_dose_mask = np.ones(shape, bool)
        self.prescriptions = self.beam_angles = None
        for name, value in fields.items():
            setattr(self, name, value)

    def __len__(self):
        return len(self.ct)


def test_each_input_is_declared_once_with_how_it_moves():
    plain = model_inputs(OPENKBP)
    assert [(s.name, s.dtype, s.length, s.moves) for s in plain] == [
        ("ct", "uint16", None, VOLUME), ("structure_masks", "uint16", None, STRUCTURE_BITS)]
    assert plain[1].mirror_bits == OPENKBP.mirror_bits == ((1 << 2, 1 << 3),)  # the parotids
    full = model_inputs(OPENKBP, patient_prescriptions=True, beam_slots=5, beam_angles=(0.0, 90.0))
    prescriptions, angles = full[2:]
    assert (prescriptions.name, prescriptions.length, prescriptions.moves, prescriptions.default) == (
        "prescriptions", 3, UNCHANGED, (56.0, 63.0, 70.0))
    assert (angles.name, angles.length, angles.moves) == ("beam_angles", 5, ANGLES)
    assert angles.default == (0.0, 90.0)  # the run's angles; the slots after them are unused
    # a spec built apart finds the vectors fitted for an equal one (SplitArrays.vectors is keyed by spec)
    assert {angles: "fitted"}.get(model_inputs(OPENKBP, beam_slots=5, beam_angles=(0.0, 90.0))[2]) == "fitted"
    assert model_inputs(wide_site())[1].dtype == "uint32"
    spec = element_spec(SIZE, full, 2, augmented=True)
    assert spec["beam_angles"].shape == (2, 5) and spec["prescriptions"].shape == (2, 3)
    assert "turn_degrees" in spec and "turn_degrees" not in element_spec(SIZE, plain, 2, augmented=True)
    assert model_spec().input_names == ("ct", "structure_masks")  # OpenKBP's default
    # the spec resolves them once: a per-patient input counts only with its channel
    assert model_spec(patient_prescriptions=True, beam_slots=9).input_names == (
        "ct", "structure_masks", "prescriptions", "beam_angles")
    assert model_spec(patient_prescriptions=True, prescription_channel=False, beam_slots=9,
                      gantry_angles=()).input_names == ("ct", "structure_masks")


def test_patients_without_their_own_take_the_run_wide_values_and_misfits_are_refused():
    specs = model_inputs(OPENKBP, patient_prescriptions=True, beam_slots=4, beam_angles=(0.0, 120.0, 240.0))
    angles = np.array([[10.0, 20.0, np.nan], [np.nan] * 3, [5.0, np.nan, 7.0]], np.float32)
    patients = Patients(3, prescriptions=np.array([[50, 60, 72], [np.nan] * 3, [56, 63, 70]], np.float32),
                        beam_angles=angles)
    taken = take_inputs(fit_vectors(patients, specs), np.array([2, 1, 0]), specs)
    np.testing.assert_array_equal(taken["prescriptions"], [[56, 63, 70], [56, 63, 70], [50, 60, 72]])
    np.testing.assert_array_equal(taken["beam_angles"], [[5, 7, np.nan, np.nan], [0, 120, 240, np.nan],
                                                         [10, 20, np.nan, np.nan]])
    nothing = take_inputs(fit_vectors(Patients(2), specs), np.arange(2), specs)  # a split without per-patient files
    np.testing.assert_array_equal(nothing["prescriptions"], [[56, 63, 70]] * 2)
    np.testing.assert_array_equal(nothing["beam_angles"], [[0, 120, 240, np.nan]] * 2)
    crowded = Patients(2, beam_angles=np.array([[0, 1, 2, 3, 4], [0, 1, np.nan, np.nan, np.nan]], np.float32))
    with pytest.raises(InputError, match="Patient pt_1: pt_1/beams.csv: 5 beams; the model takes at most 4"):
        patient_vectors(crowded, specs[3])
    crowded.folder = Path("/data/train-pats")  # load_split's: the message names the file where it is
    with pytest.raises(InputError, match="Patient pt_1: /data/train-pats/pt_1/beams.csv: 5 beams; the model takes"):
        fit_vectors(crowded, specs)
    each = model_inputs(OPENKBP, beam_slots=3, beam_angles=(0.0, 120.0, 240.0), all_beam_slots=True)[2]
    with pytest.raises(InputError, match="Patient pt_2: pt_2/beams.csv: 2 beams; the model makes one channel per beam"):
        patient_vectors(Patients(2, beam_angles=np.array([[1, 2, 3], [1, 2, np.nan]], np.float32)), each)


def test_a_patient_without_beams_csv_takes_the_runs_angles_whether_or_not_another_has_one(phantom_split, tmp_path):
    """The cache holds what the files say (NaN without one); the run's angles (not the site's
    nine) are given in one place, so pt_1's beams do not depend on pt_2's beams.csv."""
    split = phantom_split
    specs = model_inputs(OPENKBP, beam_slots=9, beam_angles=(0.0, 120.0, 240.0))
    alone = take_inputs(fit_vectors(load_split(split, cache_dir=tmp_path / "cache", site=openkbp()), specs), [0], specs)
    write_beams(split / "pt_2", [{"type": "static", "gantry_start": a} for a in (10.0, 20.0)])
    arrays = load_split(split, cache_dir=tmp_path / "cache", site=openkbp())
    assert np.isnan(arrays.beam_angles[0]).all() and arrays.beam_angles[1].tolist() == [10.0, 20.0]
    beside = take_inputs(fit_vectors(arrays, specs), [0, 1], specs)["beam_angles"]
    np.testing.assert_array_equal(beside[0], alone["beam_angles"][0])
    np.testing.assert_array_equal(beside, [[0, 120, 240] + [np.nan] * 6, [10, 20] + [np.nan] * 7])


def test_a_splits_vectors_are_made_once_not_per_batch(monkeypatch):
    spec = model_spec(resolution=SIZE, patient_prescriptions=True, beam_slots=3, gantry_angles=(0.0, 120.0, 240.0))
    specs = spec.inputs
    assert specs == model_inputs(OPENKBP, patient_prescriptions=True, beam_slots=3, beam_angles=(0.0, 120.0, 240.0))
    patients = Patients(4, beam_angles=np.array([[10.0, np.nan]] * 4, np.float32))
    with pytest.raises(ValueError, match="Expected the model's per-patient input 'prescriptions' made once"):
        take_inputs(patients, np.arange(2), specs)
    calls = []
    made = batches_module.patient_vectors
    monkeypatch.setattr(batches_module, "patient_vectors", lambda *a, **k: calls.append(a[1].name) or made(*a, **k))
    predict_arrays(lambda inputs: np.zeros((*inputs["ct"].shape, 1), np.float32), patients, spec, batch_size=1)
    assert sorted(calls) == ["beam_angles", "prescriptions"]  # four batches, each vector once
    fitted = fit_vectors(patients, specs)
    assert fit_vectors(fitted, specs) is fitted and len(calls) == 4  # made already: not again
    assert fit_vectors(patients, model_inputs(OPENKBP)) is patients  # OpenKBP's two volumes: nothing to make


def test_training_takes_per_patient_inputs_from_its_data_and_a_resume_cannot_gain_them():
    config = TrainConfig(beam_channels="count")
    own = Patients(2, beam_angles=np.array([[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100], [0] + [np.nan] * 10],
                                           np.float32), prescriptions=np.full((2, 3), 60, np.float32))
    fitted, spec, (mine, theirs) = fit_patient_inputs(config, [own, Patients(1)])
    assert (fitted.patient_prescriptions, fitted.beam_slots) == (True, 11) and spec == fitted.spec
    assert {spec.name: vectors.shape for spec, vectors in theirs.vectors.items()} == {"prescriptions": (1, 3),
                                                                                       "beam_angles": (1, 11)}
    assert fit_patient_inputs(config, [Patients(2), Patients(1)])[0] == config  # no files: today's run-wide inputs
    few = Patients(1, beam_angles=np.array([[0.0, 10.0, np.nan]], np.float32))
    assert fit_patient_inputs(config, [few])[0].beam_slots == 9  # room for a patient without its own: the run's nine
    with pytest.raises(ConfigError) as refused:
        fit_patient_inputs(config, [own], saved=config)
    assert ("it does not take the plan files of 2 patients (the first: pt_1/prescriptions.csv): prescriptions.csv as "
            "it was trained with the site's prescriptions for every patient and beams.csv as it was trained with the "
            "run-wide beams (gantry 0,40,80,120,160,200,240,280,320°), and its inputs cannot change") in str(refused.value)
    resumed = dataclasses.replace(config, patient_prescriptions=True, beam_slots=11)
    assert fit_patient_inputs(resumed, [own, Patients(1)], saved=resumed)[0] == resumed
    own.folder = Path("/data/train-pats")
    with pytest.raises(InputError, match="Patient pt_1: /data/train-pats/pt_1/beams.csv: 11 beams; the model takes "
                                         "at most 9"):
        fit_patient_inputs(dataclasses.replace(resumed, beam_slots=9), [own], saved=resumed)
    with pytest.raises(InputError, match="--beam-channels each"):
        fit_patient_inputs(TrainConfig(beam_channels="each"), [own])
    assert TrainConfig.from_json(fitted.to_json()) == fitted
    assert resume(fitted, fitted, given=None)[0].beam_slots == 11  # a library caller's config cannot drop them


def test_plan_files_a_model_does_not_take_are_named_in_one_warning_per_split(caplog):
    own = Patients(3, beam_angles=np.array([[np.nan], [0.0], [90.0]], np.float32),
                   prescriptions=np.array([[np.nan] * 3, [np.nan] * 3, [60, 60, 60]], np.float32))
    own.folder = Path("/data/train-pats")
    with caplog.at_level(logging.WARNING):
        config, _, _ = fit_patient_inputs(TrainConfig(beams=0, prescription_channel=False, model_name="m"), [own])
    assert config.beam_slots == 0 and not config.patient_prescriptions
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["Model 'm' does not take the plan files of 2 patients (the first: /data/train-pats/pt_2/"
                        "beams.csv): prescriptions.csv as it has no prescription channel (--no-prescription-channel) "
                        "and beams.csv as it has no beam channels (--beams 0); those patients get the run-wide values"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fit_patient_inputs(TrainConfig(), [own])  # a new run that takes them: nothing to say
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_site_of_more_than_16_structures_trains_a_step_on_uint32_masks():
    site = wide_site()
    spec = model_spec(resolution=SIZE, filters=2, dropout=0.0, site=site, gantry_angles=(0.0, 90.0, 180.0, 270.0))
    specs = spec.inputs
    keras.utils.set_random_seed(0)
    model = new_model(spec, 1e-3)
    model.optimizer.build(model.trainable_variables)
    assert model.get_layer("compact_inputs").output.shape[-1] == 1 + 20 + 1 + 1  # CT, structures, prescription, beams
    assert model.input["structure_masks"].dtype == "uint32"
    patients = Patients(2, bits=20, dtype=np.uint32)
    draws = Augmenter(("flip", "rotate"), patients.possible_dose_mask, seed=1).draw(np.arange(2), 0, 0)
    draws["mirrored"][:] = True  # the high mirror pair's bits are swapped on the device
    element = {name: tf.constant(value) for name, value in take_element(
        patients, np.arange(2), np.full(2, 0.5, np.float32), specs, draws=draws).items()}
    assert element["structure_masks"].dtype == tf.uint32
    step = TrainStep(model, tf.distribute.get_strategy(), batch_size=2, xla=False, spec=spec,
                     loss_fn=loss_function("mae", 0.2, spec))
    before = model_weights(model)
    loss = float(step.train(element))
    assert np.isfinite(loss) and loss > 0
    assert any(not np.array_equal(a, b) for a, b in zip(before, model_weights(model)))


@SLOW_FOR_ITS_TIME
def test_a_model_with_per_patient_inputs_trains_augmented_and_recomputed_alike_and_predicts():
    """Per-patient prescriptions and beams through the whole path: the network's inputs, the
    element, the step's augmentation (flip and turn: angles moved on the device), --recompute (the
    same loss), and prediction with --tta (the mirrored call gets the angles mirrored)."""
    spec = model_spec(resolution=SIZE, filters=2, dropout=0.0, patient_prescriptions=True, beam_slots=9)
    specs = spec.inputs
    assert [s.name for s in specs] == ["ct", "structure_masks", "prescriptions", "beam_angles"]
    patients = Patients(2, prescriptions=np.array([[50, 60, 66], [56, 63, 70]], np.float32),
                        beam_angles=np.array([[10, 80, 150, 220, 290] + [np.nan] * 4, [0, 90, 180] + [np.nan] * 6],
                                             np.float32))
    draws = Augmenter(("flip", "rotate"), patients.possible_dose_mask, seed=3).draw(np.arange(2), 0, 3)
    assert draws["turn_degrees"].tolist() != [0, 0] and draws["mirrored"].any()
    element = {name: tf.constant(value) for name, value in take_element(
        fit_vectors(patients, specs), np.arange(2), np.full(2, 0.5, np.float32), specs, draws=draws).items()}
    losses = []
    for recompute in (False, True):
        keras.backend.clear_session()
        keras.utils.set_random_seed(5)
        model = new_model(spec, 1e-3)
        model.optimizer.build(model.trainable_variables)
        step = TrainStep(model, tf.distribute.get_strategy(), batch_size=2, xla=False, recompute=recompute,
                         spec=spec, loss_fn=loss_function("mae", 0.0, spec))
        losses.append(float(step.train(element)))
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)  # recomputed one sample at a time: float32 ulps

    seen = []

    def model_call(inputs):
        seen.append({name: np.array(value) for name, value in inputs.items()})
        return np.asarray(model(inputs, training=False))

    predict_arrays(model_call, patients, spec, batch_size=2, tta=True)
    plain, mirrored = seen
    np.testing.assert_array_equal(plain["beam_angles"], patients.beam_angles)
    np.testing.assert_array_equal(mirrored["beam_angles"], np.mod(-patients.beam_angles, 360.0))
    np.testing.assert_array_equal(mirrored["prescriptions"], plain["prescriptions"])
    with pytest.raises(ValueError, match="Expected the model's inputs"):  # another model's spec: two volumes
        TrainStep(model, tf.distribute.get_strategy(), batch_size=2, xla=False, spec=model_spec(),
                  loss_fn=loss_function("mae", 0.0, spec))


@pytest.mark.slow
def test_a_run_whose_patients_have_their_own_plans_makes_them_model_inputs(prostate_model):
    """The prostate phantoms' pt_4 has its own beams.csv (seven fields) and prescriptions.csv: the
    run took both as model inputs, with room for the run's angles (patients without their own)."""
    from provided_code.run_folder import RunFolder

    folder = RunFolder(prostate_model)
    saved = folder.read_config()
    assert saved.gantry_angles == load_site("prostate").beams.gantry_angles()  # the command line's default: the site's arcs
    assert saved.patient_prescriptions and saved.beam_slots == len(saved.gantry_angles)  # 35 > the seven fields
    trained = folder.load_trained_model(None)
    model = trained.model
    assert sorted(model.input) == ["beam_angles", "ct", "prescriptions", "structure_masks"]
    assert trained.spec == saved.spec and trained.spec.input_names == ("ct", "structure_masks", "prescriptions",
                                                                        "beam_angles")
    assert model.input["beam_angles"].shape[-1] == saved.beam_slots


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_one_mirror_swap_serves_numpy_and_tensorflow(dtype):
    """--tta (numpy) and augmentation (TF) swap a flip's mirror pairs with the same code."""
    from provided_code.model_spec import swap_mirror_bits

    pairs = ((1 << 1, 1 << 4), (1 << 12, 1 << 15))
    masks = np.array([0, 1 << 1, 1 << 4, (1 << 1) | (1 << 4) | 1, 1 << 12, (1 << 15) | (1 << 7), 0xFFFF], dtype)
    expected = np.array([0, 1 << 4, 1 << 1, (1 << 1) | (1 << 4) | 1, 1 << 15, (1 << 12) | (1 << 7), 0xFFFF], dtype)
    by_numpy = swap_mirror_bits(masks, pairs, np.where)
    by_tf = swap_mirror_bits(tf.constant(masks), pairs, tf.where)
    assert by_numpy.dtype == dtype and by_tf.dtype == tf.as_dtype(dtype)
    np.testing.assert_array_equal(by_numpy, expected)
    np.testing.assert_array_equal(by_tf.numpy(), expected)
    assert swap_mirror_bits(masks, (), np.where) is masks


@SLOW_FOR_ITS_TIME
def test_the_residual_unet_with_the_physics_channel_trains_augmented_and_predicts_with_tta():
    """The residual body with the physics channel, from each patient's own beams (moved on the device
    with the patient) and voxel size: a model input declared once, in the element, the step's
    augmentation and prediction with --tta. (--recompute with this network: test_strategy's
    two-device probe, against one device without it.)"""
    spec = model_spec(arch="resunet", physics=True, resolution=SIZE, filters=2, dropout=0.0, beam_slots=9)
    specs = spec.inputs
    assert [s.name for s in specs] == ["ct", "structure_masks", "beam_angles", "voxel_dimensions"]
    assert next(s for s in specs if s.name == "voxel_dimensions").moves == UNCHANGED
    patients = Patients(2, voxel_dimensions=np.array([[3.5, 3.5, 2.0], [3.0, 3.2, 2.5]], np.float32),
                        beam_angles=np.array([[10, 80, 150, 220, 290] + [np.nan] * 4, [0, 90, 180] + [np.nan] * 6],
                                             np.float32))
    draws = Augmenter(("flip", "rotate"), patients.possible_dose_mask, seed=3).draw(np.arange(2), 0, 3)
    element = {name: tf.constant(value) for name, value in take_element(
        fit_vectors(patients, specs), np.arange(2), np.full(2, 0.5, np.float32), specs, draws=draws).items()}
    np.testing.assert_array_equal(element["voxel_dimensions"], patients.voxel_dimensions)
    keras.utils.set_random_seed(5)
    model = new_model(spec, 1e-3)
    model.optimizer.build(model.trainable_variables)
    before = model_weights(model)
    step = TrainStep(model, tf.distribute.get_strategy(), batch_size=2, xla=False, spec=spec,
                     loss_fn=loss_function("mae", 0.0, spec))
    assert np.isfinite(float(step.train(element)))
    assert any(not np.array_equal(a, b) for a, b in zip(before, model_weights(model)))
    assert model.get_layer("compact_inputs").output.shape[-1] == 1 + len(OPENKBP.names) + 1 + 1 + 1  # + physics
    predicted = predict_arrays(lambda inputs: np.asarray(model(inputs, training=False)), patients, spec,
                               batch_size=2, tta=True)
    assert np.all(np.isfinite(predicted)) and predicted.shape[0] == 2


def test_the_physics_channel_needs_beams():
    with pytest.raises(ConfigError, match="Invalid `physics`"):
        TrainConfig(physics=True, beams=0)
    with pytest.raises(ValueError, match="Invalid `physics`"):
        model_spec(physics=True, gantry_angles=())
    assert [s.name for s in model_spec(physics=True).inputs][-1] == "voxel_dimensions"
