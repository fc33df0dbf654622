import numpy as np
import pytest
import tensorflow as tf

from provided_code.losses import loss_function, masked_mean_absolute_error, mean_absolute_error


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
    np.testing.assert_allclose(masked_mean_absolute_error(element, tf.constant(predicted)).numpy(), expected, rtol=1e-6)
    # the whole-volume loss counts all 8 voxels of each patient
    whole = [(5 + 1 + 5 * 6) / 8, (2 + 5 * 7) / 8]
    np.testing.assert_allclose(mean_absolute_error(element, tf.constant(predicted)).numpy(), whole, rtol=1e-6)


def test_prediction_outside_the_mask_does_not_change_the_masked_loss():
    element, predicted = small_case()
    changed = predicted.copy()
    changed[~element["possible_dose_mask"].numpy()] = 1000.0
    loss = loss_function("masked-mae")
    assert np.array_equal(loss(element, tf.constant(predicted)).numpy(), loss(element, tf.constant(changed)).numpy())
    variable = tf.Variable(predicted)
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(loss(element, variable))
    gradient = tape.gradient(total, variable).numpy()
    assert np.all(gradient[~element["possible_dose_mask"].numpy()] == 0)
    assert np.all(gradient[element["possible_dose_mask"].numpy()] != 0)


def test_unknown_loss_is_named():
    with pytest.raises(ValueError, match="Invalid `loss`.*Received: loss='mse'"):
        loss_function("mse")
