"""The parts of the detection task (``tfmcu.train.detect``) for yolo specs: anchors from data, targets, the loss,
augmentation, the host decoder with NMS, COCO mAP and a picture of the detections.

Every box passes through the box contract of ``tfmcu.nets.anchors`` (``anchor_grid``, ``encode_boxes``,
``decode_boxes``); nothing here has box math of its own beyond IoUs. Boxes go in as ``tfmcu.data`` gives
them, ``[x0, y0, x1, y1]``, and come out of ``decode`` as ``DETECTION_POSTPROCESS`` gives them,
``[ymin, xmin, ymax, xmax]`` fractions of the input.

* **Anchors from data** (``fit_anchors``): ``kmeans_anchors`` on the training boxes' (w, h) fractions with k = the
  spec's anchor count, ``split_anchors`` into its scales; the spec the run trains (and writes) carries them.
* **Targets** (``assign_targets``): with ``positives="multi"`` (the default, YOLOv5's) a true box goes to every
  anchor shape within ``ANCHOR_RATIO`` of its width and height (the best one if none is), at the cell of that scale
  holding its centre and the two neighbouring cells nearest the centre (an offset of up to a cell and a half, which
  the encoding represents as any other); with ``positives="best"`` (YOLOv3's) only to the anchor, over all scales,
  with the best (w, h) IoU (``wh_iou``) at the centre's cell, and when two boxes want the same slot the second
  takes its next-best anchor. A slot gets objectness 1, the box's class one-hot and ``encode_boxes(box, that
  anchor)``; a slot an earlier box took stays that box's. An unassigned anchor whose box (placed at its cell,
  ``anchor_grid``) overlaps a true box with IoU > ``ignore_iou`` is *ignored*: it gets no no-object loss. Targets
  are ``[B, N, 5 + K]`` in the output's layout (``ty, tx, th, tw, obj, classes``) with obj 1 (assigned), 0
  (background) or -1 (ignored).
* **Loss** (``detection_loss``): on the concatenated outputs ``[B, N, 5 + K]``, summed over the batch and divided by
  its number of assigned anchors (SSD's normalisation): ``box_weight`` x the box loss on assigned anchors +
  objectness BCE on assigned anchors (target ``1 - obj_iou + obj_iou * IoU`` of the anchor's predicted box with its
  true box, YOLOv5's: the best-placed of a box's several positives scores highest, by a margin int8 keeps) +
  ``noobj_weight`` x objectness BCE on background anchors + ``class_weight`` x per-class BCE (sigmoid, as the score
  is ``sigmoid(obj) * sigmoid(class)``) on assigned anchors. The box loss is
  1 - GIoU of the boxes the predicted and the target encodings decode to (``box_loss="giou"``, the default:
  ``decode_boxes`` in the graph, on ``anchor_grid``), which scores the box that comes out whatever anchor encodes
  it; or 1 - CIoU (``box_loss="ciou"``: minus the squared centre distance over the hull's squared diagonal and an
  aspect term); or (``box_loss="smooth_l1"``) smooth-L1 of the four encodings: exact and cheap (the head's box
  outputs *are* the encodings ``DETECTION_POSTPROCESS`` decodes, and the encoding is scale-invariant).
  ``box_l1`` > 0 adds that weight x the smooth-L1 to the IoU loss: a predicted box that contains its true box gets
  no gradient on its centre from GIoU, and on a coarse grid (objects far smaller than a cell, far from the anchors'
  centres) an untrained head's boxes grow to cover their targets and stay there; the L1 term keeps them learning.
* **Augmentation** (``augment``, ``epoch_batches``): on the resized float images and their fractional boxes, before
  batching: horizontal flip, zoom in [1 - scale, 1 + scale] about the centre and a shift of up to ``translate`` per
  axis, one bilinear resampling (pixels that come from outside the image are black, as ``tfmcu.data``'s shifts);
  boxes move with the pixels, are clipped to the image and dropped when less than ``MIN_VISIBLE`` of their area
  stays inside. Each sample's draw is ``np.random.default_rng([seed, epoch, index])``, the epoch's order
  ``default_rng([seed, epoch])``: an epoch depends only on (seed, epoch), so a resumed run sees the same batches.
* **Decoder** (``decode``): raw outputs in anchor order (``flatten_outputs``), scores ``sigmoid(obj) *
  sigmoid(class)``, boxes ``decode_boxes``, then ``DETECTION_POSTPROCESS``'s fast NMS (``use_regular_nms=False``,
  ``max_classes_per_detection=1``): per anchor the best class score, kept if ``>= score_threshold``, sorted by score
  (stable, as TFLM's merge sort), greedy suppression of boxes with IoU ``> iou_threshold`` with a kept one, at most
  ``max_detections``; the class is the anchor's best class. Boxes are not clipped (the op does not clip either).
* **Evaluation** (``evaluate``, ``predict_detections``, ``coco_map``): COCO mAP@[.5:.95] and mAP@0.5 with
  pycocotools' ``COCOeval`` (bbox, 100 detections per image), the ground truth and the detections built in memory,
  in the pixels of the split's images; its prints are silenced.
* **Picture** (``plot_detections``): test images with their true boxes (green) and detections (red, class and
  score).

TensorFlow is imported inside the functions that need it (the loss, the training model); the rest is NumPy.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # (before the loss imports TensorFlow)

# the parts, by job: targets.py (anchors from data, targets), loss.py, augment.py (augmentation, batches),
# evaluate.py (decoder, NMS, COCO mAP, the picture); their names here, as the task (tfmcu.train.detect) uses them
from tfmcu.train.detection.targets import (  # noqa: E402,F401
    ANCHOR_RATIO, NUM_FIELDS, OBJ, POSITIVES, TargetLayout, assign_targets, box_iou, boxes_wh, fit_anchors,
    with_anchors)
from tfmcu.train.detection.loss import detection_loss, loss_metrics, training_model  # noqa: E402,F401
from tfmcu.train.detection.augment import (  # noqa: E402,F401
    FILL, MIN_VISIBLE, DetArrays, as_arrays, augment, batch_images, batches_per_epoch, epoch_batches)
from tfmcu.train.detection.evaluate import (  # noqa: E402,F401
    Detections, bootstrap_map50, coco_map, decode, evaluate, fast_nms, flatten_outputs, plot_detections,
    predict_detections)
