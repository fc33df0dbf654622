import numpy as np
import pytest
import tensorflow as tf

from provided_code.losses import loss_function, masked_mean_absolute_error, mean_absolute_error
from provided_code.config import TrainConfig

OPENKBP = TrainConfig().spec  # the default model: OpenKBP's site
STRUCTURES = OPENKBP.site.names  # OpenKBP's channel order


def small_case():
    dose = np.zeros((2, 2, 2, 2, 1), np.float32)
    dose[0, 0, 0, 0, 0], dose[0, 1, 1, 1, 0], dose[1, 0, 1, 0, 0] = 10.0, 4.0, 7.0
    mask = np.zeros((2, 2, 2, 2), bool)
    mask[0, 0, 0, 0] = mask[0, 1, 1, 1] = mask[0, 0, 0, 1] = True  # 3 voxels in patient 0
    mask[1, 0, 1, 0] = True  # 1 voxel in patient 1
    predicted = np.full((2, 2, 2, 2, 1), 5.0, np.float32)
    return {"dose": tf.constant(dose), "possible_dose_mask": tf.constant(mask)}, predicted


def test_masked_mae_equals_a_hand_computation():
    element, predicted = small_case()
    # patient 0: |10-5| + |4-5| + |0-5| over 3 voxels; patient 1: |7-5| over 1 voxel
    expected = [(5 + 1 + 5) / 3, 2.0]
    # float32 sums over 16³ voxels (TensorFlow's reduction order) against numpy's float64: ~1e-7 relative.
    np.testing.assert_allclose(masked_mean_absolute_error(element, tf.constant(predicted)).numpy(), expected, rtol=1e-6)
    # the whole-volume loss counts all 8 voxels of each patient
    whole = [(5 + 1 + 5 * 6) / 8, (2 + 5 * 7) / 8]
    np.testing.assert_allclose(mean_absolute_error(element, tf.constant(predicted)).numpy(), whole, rtol=1e-6)


def test_prediction_outside_the_mask_does_not_change_the_masked_loss():
    element, predicted = small_case()
    changed = predicted.copy()
    changed[~element["possible_dose_mask"].numpy()] = 1000.0
    loss = loss_function("masked-mae", 0.0, OPENKBP)
    assert np.array_equal(loss(element, tf.constant(predicted)).numpy(), loss(element, tf.constant(changed)).numpy())
    variable = tf.Variable(predicted)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(loss(element, variable))
    gradient = tape.gradient(total, variable).numpy()
    assert np.all(gradient[~element["possible_dose_mask"].numpy()] == 0)
    assert np.all(gradient[element["possible_dose_mask"].numpy()] != 0)


def test_unknown_loss_is_named():
    with pytest.raises(ValueError, match="Invalid `loss`.*Received: loss='mse'"):
        loss_function("mse", 0.0, OPENKBP)


def test_dvh_term_is_zero_when_perfect_positive_otherwise_with_gradients_only_inside_structures():
    from provided_code.losses import dvh_difference

    rng = np.random.default_rng(0)
    dose = rng.uniform(0, 70, (2, 4, 4, 4, 1)).astype(np.float32)
    structure_masks = np.zeros((2, 4, 4, 4), np.uint16)
    structure_masks[0, :2] |= 1 << 9  # PTV70 in the front half of patient 0
    structure_masks[0, 1:3, :2] |= 1  # Brainstem, overlapping it
    structure_masks[1, 3, 3, 3] |= 1 << 4  # one voxel of Esophagus in patient 1
    element = {"dose": tf.constant(dose), "structure_masks": tf.constant(structure_masks)}
    # the same dose on both sides: the moments cancel exactly but for float32 reassociation (~1e-7 of them).
    np.testing.assert_allclose(dvh_difference(element, tf.constant(dose), len(STRUCTURES)).numpy(), [0, 0],
                               atol=1e-6)
    # A permutation inside every structure leaves the histograms, and so the term, unchanged...
    shuffled = dose.copy()
    shuffled[0, 0] = dose[0, 0][::-1, ::-1]  # plane 0: all PTV70, no Brainstem
    # the same values in another order: float32 sums of dose¹⁰ (~1e17) reassociated, ~1e-7 relative of a
    # 10th root's argument, so ~1e-5 Gy on the moment; 1e-4 Gy bounds it.
    assert dvh_difference(element, tf.constant(shuffled), len(STRUCTURES)).numpy()[0] == pytest.approx(0,
                                                                                                     abs=1e-4)
    # ... one that moves doses into and out of a structure does not.
    shuffled[0, 1] = dose[0, 1][::-1, ::-1]  # plane 1: Brainstem rows 0-1 swap doses with rows 2-3
    assert dvh_difference(element, tf.constant(shuffled), len(STRUCTURES)).numpy()[0] > 0
    # By hand for patient 1's single voxel: every moment is the voxel's dose.
    predicted = tf.Variable(dose + 1.5)
    with tf.GradientTape() as tape:
        term = dvh_difference(element, predicted, len(STRUCTURES))
        total = tf.reduce_sum(term)
    assert term.numpy()[1] == pytest.approx(1.5, abs=1e-4)  # one voxel: every moment moves by 1.5 Gy (float32 roots)
    assert term.numpy()[0] > 0
    gradient = tape.gradient(total, predicted).numpy()[..., 0]
    inside = structure_masks > 0
    assert np.all(gradient[~inside] == 0) and np.all(gradient[inside] != 0)
    combined = loss_function("mae", dvh_weight=0.5, spec=OPENKBP)(element, predicted)
    np.testing.assert_allclose(combined.numpy(), mean_absolute_error(element, predicted).numpy() + 0.5 * term.numpy(),
                               rtol=1e-6)


def test_dvh_term_equals_its_formula_in_numpy():
    """Every structure at once, overlapping, on random doses: the term against its definition
    computed voxel by voxel in float64 (each structure's moments from its own voxels)."""
    from provided_code.losses import DVH_MOMENTS, dvh_difference

    rng = np.random.default_rng(3)
    shape = (2, 6, 6, 6)
    dose = rng.uniform(0, 75, shape + (1,)).astype(np.float32)
    predicted = np.clip(dose + rng.normal(0, 5, dose.shape), 0, None).astype(np.float32)
    structure_masks = np.zeros(shape, np.uint16)
    for bit in range(len(STRUCTURES) - 1):  # the last structure absent from both patients
        structure_masks |= ((rng.random(shape) < 0.3) * (1 << bit)).astype(np.uint16)
    element = {"dose": tf.constant(dose), "structure_masks": tf.constant(structure_masks)}
    expected = []
    for patient in range(2):
        per_structure = []
        for bit in range(len(STRUCTURES)):
            inside = (structure_masks[patient] >> bit) & 1 == 1
            if not inside.any():
                continue
            reference = dose[patient, ..., 0][inside].astype(np.float64)
            guess = predicted[patient, ..., 0][inside].astype(np.float64)
            per_structure.append(np.mean([abs(np.mean(guess ** p) ** (1 / p) - np.mean(reference ** p) ** (1 / p))
                                          for p in DVH_MOMENTS]))
        expected.append(np.mean(per_structure))
    # float32 powers up to dose¹⁰ and their 10th roots against float64 numpy: ~10 ulps, 1e-4 relative bounds it.
    np.testing.assert_allclose(dvh_difference(element, tf.constant(predicted), len(STRUCTURES)).numpy(), expected,
                               rtol=1e-4)
