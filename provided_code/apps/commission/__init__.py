"""Model commissioning: how a model's out-of-fold predictions compare with the plans it learned
from, written for the physicist who accepts the model (``report``: the HTML report; ``svg``: its
charts)."""
