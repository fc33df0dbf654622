import math

import pytest

from provided_code.training.lr_schedule import learning_rate_at


def test_warmup_then_cosine_decay():
    rates = [learning_rate_at(epoch, 1e-3, epochs=12, schedule="cosine", warmup_epochs=2) for epoch in range(12)]
    # float64 formulas written two ways (pytest's default 1e-6 relative: a few ulps would do)
    assert rates[:3] == pytest.approx([1e-3 / 3, 2e-3 / 3, 1e-3])  # warm-up below the peak, then the peak
    assert all(a > b for a, b in zip(rates[2:], rates[3:]))  # then strictly decreasing
    assert rates[7] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 5 / 10)))
    assert rates[-1] > 0


def test_constant_schedule_keeps_the_rate_after_warmup():
    assert [learning_rate_at(e, 2e-4, 5, "constant", 0) for e in range(5)] == pytest.approx([2e-4] * 5)
    assert [learning_rate_at(e, 2e-4, 5, "constant", 1) for e in range(2)] == pytest.approx([1e-4, 2e-4])
    assert [learning_rate_at(e, 2e-4, 5, "constant", 2) for e in range(3)] == pytest.approx([2e-4 / 3, 4e-4 / 3, 2e-4])


def test_unknown_schedule_is_named():
    with pytest.raises(ValueError, match="Received: schedule='step'"):
        learning_rate_at(0, 1e-3, 10, "step")
