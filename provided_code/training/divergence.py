"""A run that diverges stops before it writes anything of the diverged state.

The rule, on each epoch's mean training loss (the figure of ``training_log.csv``'s ``loss``
column): the run stops if it is not finite, if it exceeds ``DIVERGENCE_FACTOR`` (100) times the
lowest epoch loss so far in this run (its log's rows from earlier processes, a resume, and this
process's epochs, counted from the epoch that started today's loss: a ``--change-recipe`` of
``loss`` or ``dvh_weight`` starts a new comparison, since the figures of two losses differ), or
if it exceeds a ceiling that holds whatever the loss and its history: ``DIVERGENCE_FACTOR`` times
the site's highest prescription times (1 + the DVH term's weight). Every loss here is in Gy and
bounded by the doses compared (a mean absolute error, and the DVH term's moments, are at most the
higher of the two doses), so a loss 100 times the highest prescription is a model that predicts
nothing like a dose; the ceiling is what the first epochs of a changed loss, or of a new run, are
held to before they have a history. A loss that falls by orders of magnitude is what training
does; one that rises by two is a rate far too high (a resume with ``--learning-rate 2e4`` for 2e-4
reached 5e9 in one epoch; ``--change-recipe --loss mae --learning-rate 1e5``, 2.3e9) or a broken
setting. The check runs before the epoch's validation, scores, log row and checkpoint.

Under loss scaling (mixed precision) a step whose loss or gradients are not finite is skipped by
the loss-scale optimizer (the weights stay, the scale is lowered): its loss is left out of the
epoch's mean, with a warning. The mean is then over the steps that updated the weights; only an
epoch in which every step was skipped has a non-finite loss.
"""

from __future__ import annotations

import logging
import math

import tensorflow as tf

from provided_code.errors import UserError

logger = logging.getLogger(__name__)

DIVERGENCE_FACTOR = 100.0


class DivergenceError(UserError, RuntimeError):
    """Training diverged; the message names the epoch and its loss."""


def epoch_mean_loss(losses: list, loss_scaling: bool = False, epoch: int | None = None) -> float:
    """The mean of an epoch's step losses (each a scalar tensor). Under ``loss_scaling`` the
    non-finite ones (steps the loss scale skipped) are left out, and said."""
    mean = float(tf.add_n(losses)) / len(losses)
    if math.isfinite(mean) or not loss_scaling:
        return mean
    values = [float(loss) for loss in losses]
    finite = [value for value in values if math.isfinite(value)]
    logger.warning("Epoch %s: %d of %d steps had a non-finite loss and were skipped by the loss scale (weights "
                   "unchanged); the epoch's loss is the mean of the other %d", "?" if epoch is None else epoch + 1,
                   len(values) - len(finite), len(values), len(finite))
    return sum(finite) / len(finite) if finite else math.nan


class DivergenceGuard:
    """``check(epoch, loss)`` raises :class:`DivergenceError` if the epoch's loss breaks the rule
    (see the module); otherwise it joins the history.

    ``history``: ``(epoch, loss)`` of the run's earlier epochs (1-based). ``newest_checkpoint``:
    a function giving the path the run would resume from, for the message. ``highest_dose_gy``:
    the site's highest prescription times (1 + the DVH term's weight), whose ``factor`` times is
    the ceiling (None: no ceiling).
    """

    def __init__(self, history: list[tuple[int, float]], factor: float = DIVERGENCE_FACTOR,
                 newest_checkpoint=lambda: None, highest_dose_gy: float | None = None):
        self.factor = factor
        self.ceiling = None if highest_dose_gy is None else factor * highest_dose_gy
        self.lowest = None  # (epoch, loss)
        self.newest_checkpoint = newest_checkpoint
        for epoch, loss in history:
            self._note(epoch, loss)

    def _note(self, epoch: int, loss: float) -> None:
        if math.isfinite(loss) and loss > 0 and (self.lowest is None or loss < self.lowest[1]):
            self.lowest = (epoch, loss)

    def check(self, epoch: int, loss: float) -> None:
        """``epoch``: 0-based, as the loop counts."""
        done = epoch + 1
        if not math.isfinite(loss):
            why = f"its mean training loss is {loss}"
        elif self.lowest is not None and loss > self.factor * self.lowest[1]:
            why = (f"its mean training loss {loss:.4g} is more than {self.factor:g} × the lowest of this run "
                   f"({self.lowest[1]:.4g} at epoch {self.lowest[0]})")
        elif self.ceiling is not None and loss > self.ceiling:
            why = (f"its mean training loss {loss:.4g} Gy is more than {self.factor:g} × the highest dose it compares "
                   f"({self.ceiling:.4g} Gy: an error no model of doses makes)")
        else:
            self._note(done, loss)
            return
        newest = self.newest_checkpoint()
        raise DivergenceError(
            f"Training diverged at epoch {done}: {why}. Stopped before saving that epoch"
            + (f"; the newest checkpoint, {newest}, is kept" if newest is not None else "")
            + ". Resume with a lower --learning-rate (and --change-recipe), or check the recipe.")


def loss_history(rows: list[dict[str, str]], first_epoch: int, last_epoch: int) -> list[tuple[int, float]]:
    """``(epoch, loss)`` of the log rows ``first_epoch .. last_epoch`` (1-based, inclusive) that
    have a loss."""
    history = []
    for row in rows:
        epoch = int(row["epoch"])
        if first_epoch <= epoch <= last_epoch and row.get("loss"):
            try:
                history.append((epoch, float(row["loss"])))
            except ValueError:
                continue
    return history

