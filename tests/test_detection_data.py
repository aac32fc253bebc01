"""tfmcu.data for detection: detection scenes (``scenes_det``), COCO folders (``coco``), write_coco,
resize_for_model, the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import replace

import numpy as np
import pytest

from tfmcu.data import catalog, coco, scenes, scenes_det, shapes_det
from tfmcu.data.images import resize_for_model
from tfmcu.data.split import DataError
from tfmcu.errors import TfmcuError
from tests.support import fake_idx_set, run_python

SMALL = "scenes-det:canvas=64,object_px=8-24,train=12,val=4,test=5,seed=3"


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory) -> str:
    return fake_idx_set(tmp_path_factory.mktemp("idx") / "fm", n_train=120, n_test=30)


def blob_pool(n: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """28x28 glyphs whose ink is an off-centre rectangle (so the tight box is not the pasted square)."""
    rng = np.random.default_rng(0)
    pool = np.zeros((n, 28, 28), np.uint8)
    for i in range(n):
        y0, x0 = rng.integers(2, 10, 2)
        h, w = rng.integers(6, 16, 2)
        pool[i, y0:y0 + h, x0:x0 + w] = 200
    return pool, (np.arange(n) % 10).astype(np.int32)


def render(config: scenes_det.DetSceneConfig, n: int, split: str = "train") -> list[scenes_det.DetScene]:
    pool, labels = blob_pool()
    return [scenes_det.render(config, pool, labels, rng) for rng in scenes.sample_rngs(config, split, n)]


def tight_box(mask: np.ndarray) -> list[float]:
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    return [cols[0], rows[0], cols[-1] + 1, rows[-1] + 1]


# ----------------------------------------------------------------------------- names
def test_names_parse_strictly():
    assert scenes_det.parse_name("scenes") is None and scenes_det.parse_name("fashion_mnist") is None
    assert scenes.parse_name("scenes-det") is None  # the classification scenes do not take detection names
    c = scenes_det.parse_name("scenes-det")
    assert c == scenes_det.DetSceneConfig() and (c.canvas, c.objects, c.object_px) == (160, (1, 4), (8, 40))
    c = scenes_det.parse_name("scenes-det:source=mnist,canvas=256,objects=0-6,object_px=12-48,distractors=3,"
                              "border=0.3,max_iou=0.2,train=10,val=2,test=3,seed=4")
    assert (c.source, c.canvas, c.objects, c.object_px, c.distractors, c.border, c.max_iou, c.train, c.seed) == (
        "mnist", 256, (0, 6), (12, 48), (3, 3), 0.3, 0.2, 10, 4)
    for bad, what in [("scenes-det:colour=red", "key=value"), ("scenes-det:canvas=big", "not a number"),
                      ("scenes-det:objects=a-b", "not a number range"), ("scenes-det:canvas=64", "object_px"),
                      ("scenes-det:source=cifar", "source"), ("scenes-det:border=1.5", "border"),
                      ("scenes-det:objects=3-1", "objects"), ("scenes-det:canvas", "key=value")]:
        with pytest.raises(DataError, match=what):
            scenes_det.parse_name(bad)
        with pytest.raises(DataError, match=what) as e:
            catalog.load_detection(bad)
        assert isinstance(e.value, TfmcuError) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- scenes
def test_scenes_are_deterministic_and_split(idx_dir):
    ds = catalog.load_detection(SMALL, data_dir=idx_dir)
    assert ds.train.images.shape == (12, 64, 64, 1) and ds.train.images.dtype == np.uint8
    assert (len(ds.val), len(ds.test), ds.channels, ds.num_classes) == (4, 5, 1, 10)
    assert list(ds.train.image_ids) == list(range(1, 13)) and ds.info["scenes_det"]["canvas"] == 64
    for b, lab in zip(ds.train.boxes, ds.train.labels):
        assert b.dtype == np.float32 and b.shape == (len(lab), 4) and lab.dtype == np.int32
    again = catalog.load_detection(SMALL, data_dir=idx_dir)
    assert np.array_equal(ds.train.images, again.train.images)
    assert all(np.array_equal(a, b) for a, b in zip(ds.test.boxes, again.test.boxes))
    assert all(np.array_equal(a, b) for a, b in zip(ds.test.labels, again.test.labels))
    # A sample depends on (seed, split, index) only: a smaller split is a prefix of a larger one.
    small = catalog.load_detection(SMALL.replace("train=12", "train=5"), data_dir=idx_dir)
    assert np.array_equal(small.train.images, ds.train.images[:5])
    assert all(np.array_equal(a, b) for a, b in zip(small.train.boxes, ds.train.boxes))
    # Splits and seeds differ.
    assert not np.array_equal(ds.train.images[:4], ds.val.images)
    other = catalog.load_detection(SMALL.replace("seed=3", "seed=4"), data_dir=idx_dir)
    assert not np.array_equal(other.train.images, ds.train.images)


def test_boxes_are_tight_around_the_visible_ink():
    clean = scenes_det.DetSceneConfig(canvas=64, object_px=(8, 30), distractors=(0, 0), noise=0.0, clutter=0.0,
                                      border=0.4, seed=1)
    # One object on a black canvas: its box is exactly the tight box of the bright pixels.
    one = render(replace(clean, objects=(1, 1)), 40)
    assert all(len(s.boxes) == 1 for s in one)
    for s in one:
        assert s.boxes[0].tolist() == tight_box(s.image >= scenes_det.INK)
    # The glyphs' ink is narrower than the glyph: boxes are not the pasted squares (whose side is >= 8).
    assert min(float(np.min(s.boxes[0, 2:] - s.boxes[0, :2])) for s in one) < 8
    # Several objects: every bright pixel lies in a box, every box edge holds a bright pixel, boxes lie in the canvas.
    for s in render(replace(clean, objects=(2, 4)), 30):
        ink = s.image >= scenes_det.INK
        covered = np.zeros_like(ink)
        for x0, y0, x1, y1 in s.boxes.astype(int):
            assert 0 <= x0 < x1 <= 64 and 0 <= y0 < y1 <= 64
            inside = ink[y0:y1, x0:x1]
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            covered[y0:y1, x0:x1] = True
        assert not (ink & ~covered).any()


def test_border_cuts_empty_scenes_and_overlap_limit():
    base = scenes_det.DetSceneConfig(canvas=64, objects=(0, 4), object_px=(10, 28), border=0.5, max_iou=0.3)
    shown = render(base, 60)
    boxes = np.concatenate([s.boxes for s in shown])
    truncated = np.concatenate([s.truncated for s in shown])
    assert any(len(s.boxes) == 0 for s in shown)  # objects=0-4 makes empty scenes
    assert truncated.sum() >= 3  # objects cut by the border occur ...
    cut = boxes[truncated]  # ... and their boxes end at the canvas edge
    assert ((cut[:, :2] == 0) | (cut[:, 2:] == 64)).any(axis=1).all()
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2:] <= 64).all() and (boxes[:, 2:] > boxes[:, :2]).all()
    ious = [scenes_det.iou(a, b) for s in shown for i, a in enumerate(s.boxes) for b in s.boxes[:i]]
    assert max(ious) <= 0.3 and any(v > 0 for v in ious)  # objects overlap, within the limit
    inside = render(replace(base, border=0.0), 30)
    assert not np.concatenate([s.truncated for s in inside]).any()
    none = render(replace(base, objects=(0, 0)), 3)
    assert all(s.boxes.shape == (0, 4) and s.labels.shape == (0,) for s in none)


# ----------------------------------------------------------------------------- COCO
def test_coco_round_trip(idx_dir, tmp_path):
    from pycocotools.coco import COCO

    ds = catalog.load_detection(SMALL.replace("seed=3", "seed=5") + ",objects=0-4", data_dir=idx_dir)
    out = tmp_path / "coco"
    paths = coco.write_coco_dataset(ds, str(out))
    assert sorted(os.listdir(out)) == ["images", "test.json", "train.json", "val.json"] and len(paths) == 3
    train_json = COCO(str(out / "train.json"))
    assert len(train_json.getImgIds()) == 12 and len(train_json.getAnnIds()) == sum(len(b) for b in ds.train.boxes)
    back = catalog.load_detection(str(out))
    assert back.class_names == ds.class_names and back.channels == 1
    for s in coco.SPLITS:
        a, b = ds.split(s), back.split(s)
        assert len(a) == len(b) and list(a.image_ids) == list(b.image_ids) and not b.in_memory
        for i in range(len(a)):
            assert np.array_equal(a.boxes[i], b.boxes[i]) and np.array_equal(a.labels[i], b.labels[i])
            assert np.array_equal(a.image(i), b.image(i))
    # One annotations.json: val and test are seeded fractions of its images.
    single = tmp_path / "single"
    coco.write_coco(ds.train, str(single), "annotations", ds.class_names)
    held = catalog.load_detection(str(single), seed=1, val_fraction=0.25, test_fraction=0.25)
    ids = [list(held.split(s).image_ids) for s in coco.SPLITS]
    assert [len(i) for i in ids] == [6, 3, 3] and sorted(sum(ids, [])) == list(range(1, 13))
    assert held.info["held_out"]["val"].startswith("0.25")
    k = list(ds.train.image_ids).index(ids[1][0])
    assert np.array_equal(held.val.boxes[0], ds.train.boxes[k])


def coco_folder(root) -> str:
    os.makedirs(root / "images")
    from PIL import Image

    Image.fromarray(np.zeros((20, 30), np.uint8)).save(root / "images" / "a.png")
    Image.fromarray(np.zeros((20, 30, 3), np.uint8)).save(root / "b.png")
    doc = {"images": [{"id": 7, "file_name": "a.png", "width": 30, "height": 20}, {"id": 9, "file_name": "b.png"}],
           "annotations": [{"id": 1, "image_id": 7, "category_id": 5, "bbox": [1, 2, 10, 5]},
                           {"id": 2, "image_id": 9, "category_id": 2, "bbox": [20.5, 0, 20, 8]},  # clipped at x=30
                           {"id": 3, "image_id": 9, "category_id": 2, "bbox": [0, 0, 1, 1], "iscrowd": 1}],
           "categories": [{"id": 5, "name": "cat"}, {"id": 2, "name": "dog"}]}
    (root / "train.json").write_text(json.dumps(doc))
    return str(root)


def test_coco_folder_reads_categories_clips_and_skips_crowds(tmp_path):
    ds = catalog.load_detection(coco_folder(tmp_path / "c"), val_fraction=0.0, test_fraction=0.0)
    assert ds.class_names == ["dog", "cat"] and ds.channels == 3  # sorted category ids 2, 5; b.png is RGB
    assert list(ds.train.image_ids) == [7, 9] and len(ds.val) == 0 and len(ds.test) == 0
    assert ds.train.boxes[0].tolist() == [[1, 2, 11, 7]] and ds.train.labels[0].tolist() == [1]
    assert ds.train.boxes[1].tolist() == [[20.5, 0, 30, 8]] and ds.train.labels[1].tolist() == [0]
    assert ds.train.image(0).shape == (20, 30, 1) and ds.train.image(1).shape == (20, 30, 3)


@pytest.mark.parametrize("edit, what", [
    (lambda d: "{'images': [", "malformed JSON"),
    (lambda d: json.dumps([1, 2]), "expected a JSON object"),
    (lambda d: json.dumps({**d, "annotations": d["annotations"] + [{"id": 4, "image_id": 99, "category_id": 2,
                                                                       "bbox": [0, 0, 1, 1]}]}), "image id 99"),
    (lambda d: json.dumps({**d, "annotations": [{**d["annotations"][0], "bbox": [1, 2, -3, 4]}]}), "negative"),
    (lambda d: json.dumps({**d, "annotations": [{**d["annotations"][0], "bbox": [1, 2]}]}), "not 4 numbers"),
    (lambda d: json.dumps({**d, "annotations": [{**d["annotations"][0], "category_id": 3}]}), "category id 3"),
    (lambda d: json.dumps({**d, "images": d["images"] + [{"id": 10, "file_name": "gone.png"}]}),
     "gone.png not found"),
    (lambda d: json.dumps({**d, "images": [{**d["images"][0], "width": 31}, d["images"][1]]}), "is 30 x 20"),
    (lambda d: json.dumps({**d, "annotations": [{"image_id": 7}]}), "lacks the field 'id'"),
])
def test_broken_coco_files_are_one_line_errors(tmp_path, edit, what):
    root = coco_folder(tmp_path / "c")
    path = os.path.join(root, "train.json")
    with open(path) as f:
        doc = json.load(f)
    with open(path, "w") as f:
        f.write(edit(doc))
    with pytest.raises(DataError, match=what) as e:
        catalog.load_detection(root)
    assert "\n" not in str(e.value) and "train.json" in str(e.value)


def test_missing_folders_and_files_are_one_line_errors(tmp_path):
    for root, what in [(tmp_path / "nowhere", "no such folder"), (tmp_path, "no annotation file")]:
        with pytest.raises(DataError, match=what) as e:
            catalog.load_detection(str(root))
        assert "\n" not in str(e.value)
    (tmp_path / "val.json").write_text("{}")
    with pytest.raises(DataError, match="no train.json"):
        catalog.load_detection(str(tmp_path))
    (tmp_path / "annotations.json").write_text("{}")
    with pytest.raises(DataError, match="keep one layout"):
        catalog.load_detection(str(tmp_path))


# ----------------------------------------------------------------------------- model inputs
def test_resize_for_model():
    images = np.zeros((2, 64, 32, 1), np.uint8)
    images[0] = 255
    x, rel = resize_for_model(images, [np.array([[8, 16, 24, 64]], np.float32), np.zeros((0, 4), np.float32)], 16)
    assert x.shape == (2, 16, 16, 3) and x.dtype == np.float32
    assert np.allclose(x[0], 1.0) and np.allclose(x[1], -1.0)
    assert rel[0].tolist() == [[0.25, 0.25, 0.75, 1.0]] and rel[1].shape == (0, 4)
    grey, _ = resize_for_model([np.full((10, 10, 3), 127.5, np.float32)], [np.zeros((0, 4))], 4, channels=1)
    assert grey.shape == (1, 4, 4, 1) and np.allclose(grey, 0.0, atol=1e-3)


# ----------------------------------------------------------------------------- command line
def test_cli_writes_coco_and_fails_in_one_line(idx_dir, tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_python("-m", "tfmcu.data", *args)

    out = tmp_path / "out"
    bad = cli("--dataset=scenes-det:canvas=big", f"--write_coco={out}")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "canvas=big" in bad.stderr
    assert os.listdir(tmp_path) == []  # nothing written, not even a temporary folder
    ok = cli(f"--dataset={SMALL}", f"--data_dir={idx_dir}", f"--write_coco={out}")
    assert ok.returncode == 0, ok.stderr
    assert sorted(os.listdir(out)) == ["images", "test.json", "train.json", "val.json"]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temporary folder left
    again = cli(f"--dataset={SMALL}", f"--data_dir={idx_dir}", f"--write_coco={out}")
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "already exists" in again.stderr


# ----------------------------------------------------------------------------- Pascal VOC folders
VOC_OBJECTS = {  # image id -> (name, xmin, ymin, xmax, ymax, difficult)
    "2008_000001": [("person", 11, 21, 40, 60, 0), ("car", 1, 1, 64, 30, 0)],
    "2008_000002": [("car", 5, 5, 20, 20, 0), ("person", 30, 30, 50, 50, 1)],
    "2008_000003": [("person", 2, 3, 10, 12, 0)],
    "2008_000004": [("car", 40, 10, 64, 48, 0)],
    "2008_000005": [("person", 8, 8, 24, 24, 0), ("person", 30, 8, 60, 40, 0)],
    "2008_000006": [],
}


def write_voc(root, objects=VOC_OBJECTS, lists=(("train", 4), ("val", 2))) -> str:
    """A VOC folder of 64x48 JPEGs with the given objects; ImageSets/Main lists of the first ids in order."""
    from PIL import Image

    for sub in ("Annotations", "JPEGImages", os.path.join("ImageSets", "Main")):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    for n, (image_id, objs) in enumerate(objects.items()):
        Image.fromarray(np.full((48, 64, 3), 40 * n, np.uint8)).save(os.path.join(root, "JPEGImages",
                                                                                f"{image_id}.jpg"))
        xml = "".join(f"<object><name>{name}</name><difficult>{d}</difficult><bndbox><xmin>{x0}</xmin>"
                      f"<ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>"
                      for name, x0, y0, x1, y1, d in objs)
        with open(os.path.join(root, "Annotations", f"{image_id}.xml"), "w") as f:
            f.write(f"<annotation><filename>{image_id}.jpg</filename><size><width>64</width><height>48</height>"
                    f"<depth>3</depth></size>{xml}</annotation>")
    ids, start = list(objects), 0
    for split, count in lists:
        with open(os.path.join(root, "ImageSets", "Main", f"{split}.txt"), "w") as f:
            f.write("".join(f"{i}\n" for i in ids[start:start + count]))
        start += count
    return str(root)


def test_voc_folder_reads_boxes_skips_difficult_and_holds_out_test(tmp_path):
    root = write_voc(tmp_path / "VOC2012")
    assert catalog.kind(root) == catalog.DETECTION and catalog.kind(root + ":classes=person") == catalog.DETECTION
    ds = catalog.load_detection(root, seed=0, test_fraction=0.25)
    assert ds.class_names == ["car", "person"] and ds.channels == 3 and ds.boxes
    assert (len(ds.train), len(ds.val), len(ds.test)) == (3, 2, 1)  # test: a quarter of train.txt's 4, held out
    assert ds.info["held_out"] == {"test": "0.25 of train.txt (seed 0)"}
    everything = {os.path.basename(str(p))[:-4]: (b.tolist(), lab.tolist())
                  for split in (ds.train, ds.val, ds.test) for p, b, lab in zip(split.paths, split.boxes, split.labels)}
    assert everything["2008_000001"] == ([[10, 20, 40, 60 - 12], [0, 0, 64, 30]], [1, 0])  # 1-based corners, clipped
    assert everything["2008_000002"] == ([[4, 4, 20, 20]], [0])  # the difficult person left out
    person = catalog.load_detection(root + ":classes=person", seed=0, test_fraction=0.25)
    assert person.class_names == ["person"] and person.info["classes"] == ["person"]
    assert [lab.tolist() for lab in person.val.labels] == [[0, 0], []]  # 2008_000005's two, 2008_000006 none
    assert sum(len(b) for b in person.train.boxes) + sum(len(b) for b in person.test.boxes) == 2


def test_voc_converts_to_a_coco_folder_with_the_same_boxes(tmp_path):
    root = write_voc(tmp_path / "VOC2012", lists=(("train", 3), ("val", 2), ("test", 1)))
    out = tmp_path / "coco"
    r = run_python("-m", "tfmcu.data", f"--dataset={root}:classes=person,car", f"--write_coco={out}")
    assert r.returncode == 0, r.stderr
    back = catalog.load_detection(str(out))
    ds = catalog.load_detection(root + ":classes=person,car")
    assert back.class_names == ds.class_names == ["person", "car"]
    for s in ("train", "val", "test"):
        a, b = ds.split(s), back.split(s)
        assert [x.tolist() for x in a.boxes] == [x.tolist() for x in b.boxes]
        assert [x.tolist() for x in a.labels] == [x.tolist() for x in b.labels]


@pytest.mark.parametrize("edit,what", [
    (lambda root: open(os.path.join(root, "Annotations", "2008_000001.xml"), "w").write("<annotation>"),
     "2008_000001.xml: not well-formed XML"),
    (lambda root: os.remove(os.path.join(root, "Annotations", "2008_000002.xml")),
     "2008_000002.xml: missing (image id '2008_000002' is listed"),
    (lambda root: os.remove(os.path.join(root, "JPEGImages", "2008_000003.jpg")), "2008_000003.jpg is missing"),
])
def test_broken_voc_folders_are_one_line_errors(tmp_path, edit, what):
    root = write_voc(tmp_path / "VOC2012")
    edit(root)
    with pytest.raises(DataError, match=re.escape(what)) as e:
        catalog.load_detection(root)
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="no class dog .*its classes: car, person"):
        catalog.load_detection(write_voc(tmp_path / "ok") + ":classes=dog")


# ============================================================================= shapes-det
def test_shapes_are_deterministic_exact_and_apart():
    """shapes-det: a split is the same on every load; every box is the tight box of pixels of its shape's one flat
    colour that reaches all four sides, shapes do not overlap, labels are the first `classes` shapes."""
    name = "shapes-det:classes=5,train=40,val=8,test=8,objects=2-4,noise=20"
    assert catalog.kind(name) == catalog.DETECTION
    ds = catalog.load_detection(name)
    again = catalog.load_detection(name)
    assert ds.class_names == list(shapes_det.SHAPES) and ds.channels == 3 and ds.flip
    assert (len(ds.train), len(ds.val), len(ds.test)) == (40, 8, 8)
    assert np.array_equal(ds.train.images, again.train.images)
    assert all(np.array_equal(a, b) for a, b in zip(ds.train.boxes, again.train.boxes))
    assert not np.array_equal(ds.train.images[:8], ds.val.images)  # the splits are their own draws
    seen = set()
    for img, boxes, labels in zip(ds.train.images, ds.train.boxes, ds.train.labels):
        assert img.shape == (96, 96, 3) and img.dtype == np.uint8 and len(boxes) == len(labels)
        for i, (box, label) in enumerate(zip(boxes.astype(int), labels)):
            seen.add(int(label))
            x0, y0, x1, y1 = box
            assert 0 <= x0 < x1 <= 96 and 0 <= y0 < y1 <= 96
            crop = img[y0:y1, x0:x1].reshape(-1, 3)
            colours, counts = np.unique(crop, axis=0, return_counts=True)
            colour = colours[np.argmax(counts)]  # the shape's flat colour (noise pixels are all different)
            inside = np.all(img[y0:y1, x0:x1] == colour, axis=-1)
            # tight: the shape reaches every side of its box
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            for other in boxes[i + 1:]:
                assert scenes_det.iou(box, other) == 0.0
    assert seen == set(range(5))


def test_shape_masks():
    for shape in shapes_det.SHAPES:
        m = shapes_det.shape_mask(shape, 20, 16)
        assert m.shape == (20, 16) and m.any(axis=1)[2:-2].all() and m.any(axis=0)[2:-2].all(), shape
    assert shapes_det.shape_mask("square", 5, 7).all()
    m = shapes_det.shape_mask("triangle", 20, 20)
    assert m[-1].sum() > m[1].sum()  # wider at the base


@pytest.mark.parametrize("name, what", [
    ("shapes-det:classes=6", "classes=6: expected 1..5"),
    ("shapes-det:object_px=4-10", "object_px=4-10"),
    ("shapes-det:object_px=10-60", "object_px=10-60"),
    ("shapes-det:colour=red", "'colour=red' is not key=value with a key among"),
    ("shapes-det:objects=3-1", "objects=3-1"),
])
def test_shapes_names_are_one_line_errors(name, what):
    with pytest.raises(DataError, match=re.escape(what)):
        catalog.load_detection(name)
