"""Training on ``tfmcu.data``: one trainer (``trainer``) runs a task (``classify``, ``detect``: ``task.Task``) through
a float phase and a QAT phase (``qat``) with checkpoints (``checkpoints``), exports it to int8 and evaluates it in TF
Lite and TFLM (``export``), and returns a typed report (``report.TrainReport``); the settings are ``config``'s.

The public API, for pipelines, benches and tests: ``train(config, out_dir)`` and the names below.
"""

from tfmcu.train.checkpoints import Checkpoints
from tfmcu.train.config import DetectionOptions, Recipe, TrainConfig, TrainError, default_config
from tfmcu.train.export import classifier_as_conv, quantize_inputs, run_int8
from tfmcu.train.qat import make_optimizer, make_strategy, quantize, recalibrate_bn
from tfmcu.train.report import TrainReport
from tfmcu.train.trainer import train, validate

__all__ = ["Checkpoints", "DetectionOptions", "Recipe", "TrainConfig", "TrainError", "TrainReport",
           "classifier_as_conv", "default_config", "make_optimizer", "make_strategy", "quantize", "quantize_inputs",
           "recalibrate_bn", "run_int8", "train", "validate"]
