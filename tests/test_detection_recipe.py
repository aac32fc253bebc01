"""The detector's default recipe learns: the default detector (``mbv2-det2-w035``) trained with ``train
--task=detection``'s defaults on flat shapes on noise (``shapes-det``, 96 px) for 300 steps finds them. (The
full measurement, 96 px within 10 minutes against the options the detector trained with before, is the bench section
``detection_recipe``.)"""

from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from tfmcu import train  # noqa: E402

DATASET = "shapes-det:train=480,val=32,test=96"
EPOCHS = 10


def test_the_default_recipe_finds_shapes(tmp_path):
    base = train.default_config("detection")
    o = base.detection
    assert (base.model, o.positives, o.box_loss, o.box_l1, o.obj_iou) == ("mbv2-det2-w035", "multi", "giou", 0.05,
                                                                          0.5)
    recipe = dataclasses.replace(base.recipe, epochs=EPOCHS, bn_recalibration_batches=4)
    cfg = train.default_config("detection", dataset=DATASET, resolution=96, recipe=recipe, verbose=0, seed=1,
                               detection=dataclasses.replace(base.detection, int8=False))
    report = train.train(cfg, str(tmp_path / "run"), log=lambda m: None)
    curve = [round(e["val_map50"], 3) for e in report.history.float]
    print(f"defaults: val mAP@0.5 per epoch {curve}; test mAP@0.5 {report.detection.map50.float:.3f}")
    assert report.detection.map50.float >= 0.25  # (an untrained detector: about 0.01; 0.463 measured)
