"""Training: the Learner loop, metrics, callbacks, checkpoints, progress and curves."""

from ember.train.callbacks import (
    Callback,
    CSVLogger,
    EarlyStopping,
    LambdaCallback,
    ModelCheckpoint,
)
from ember.train.checkpoint import load_checkpoint, load_model_state, save_checkpoint
from ember.train.learner import Learner, fit
from ember.train.metrics import F1, Accuracy, Loss, MeanSquaredError, Metric, TopKAccuracy
from ember.train.plot import PlotCurves, plot_history
from ember.train.progress import ProgressBar

__all__ = [
    "Learner", "fit", "Metric", "Loss", "Accuracy", "TopKAccuracy", "F1", "MeanSquaredError",
    "Callback", "LambdaCallback", "EarlyStopping", "ModelCheckpoint", "CSVLogger", "ProgressBar",
    "PlotCurves", "plot_history", "save_checkpoint", "load_checkpoint", "load_model_state",
]  # fmt: skip
