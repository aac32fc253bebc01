"""Training on ``tfmcu.data``: the recipe (``config``), float training and QAT
(``qat``, ``loop``), checkpoints, int8 export and evaluation (``export``), plots.

The public API, for pipelines and tests: ``train(config, out_dir)`` and the names below.
"""

from tfmcu.train.checkpoints import Checkpoints
from tfmcu.train.config import Recipe, TrainConfig, TrainError, resolve_spec
from tfmcu.train.export import classifier_as_conv, quantize_inputs, run_int8
from tfmcu.train.loop import format_summary, train, validate
from tfmcu.train.qat import make_optimizer, make_strategy, quantize, recalibrate_bn

__all__ = ["Checkpoints", "Recipe", "TrainConfig", "TrainError", "classifier_as_conv", "format_summary",
           "make_optimizer", "make_strategy", "quantize", "quantize_inputs", "recalibrate_bn", "resolve_spec",
           "run_int8", "train", "validate"]
