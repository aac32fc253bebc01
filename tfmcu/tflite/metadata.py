"""TFLite model metadata (tflite-support): class labels and input normalisation, written and read back.

tflite-support 0.4.4 pins protobuf<4, which TF 2.21 cannot use, so it is installed with ``pip install --no-deps``
and only its metadata modules are imported (``tensorflow_lite_support.metadata.python...``); the top-level
``tflite_support`` package loads task-library protos that fail under protobuf 7 and must not be imported.

``add_metadata(model, labels, mean, std, ...)`` returns the model with a ``TFLITE_METADATA`` entry (name,
description, input image with its normalisation ``(pixel - mean) / std`` and colour space, classification output)
and the label file packed as an associated file (a zip appended after the flatbuffer; TFLM and TF Lite ignore it,
the model editor keeps it). ``read_metadata(model)`` returns the metadata as a dict with the labels.

``add_detector_metadata(model, labels, mean, std, ...)`` does the same for a detector whose outputs are those of
TFLite's detection post-processing op (``tfmcu.tflite.detection_postprocess``): tflite-support's object-detector
metadata (input normalisation; outputs location, category, score, number of detections; the label file on the
category output). tfmcu's own record of the detector (anchors per scale, thresholds, labels) is the
``tfmcu_detector`` metadata entry ``append_postprocess`` writes; the populator keeps it.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
from typing import Any, Sequence

from tfmcu.errors import TfmcuError

LABEL_FILE = "labels.txt"


class MetadataError(TfmcuError):
    """tflite-support is missing or the metadata cannot be written / read; one line."""


def _writers():
    try:
        from tensorflow_lite_support.metadata import metadata_schema_py_generated as fb
        from tensorflow_lite_support.metadata.python.metadata_writers import image_classifier, metadata_info
        from tensorflow_lite_support.metadata.python.metadata_writers import object_detector  # noqa: F401
    except ImportError as e:
        raise MetadataError(f"tflite-support is not importable ({e}); install it with "
                            f"`pip install --no-deps tflite-support==0.4.4` (make setup does)") from None
    return image_classifier, metadata_info, fb


def _label_file(folder: str, labels: Sequence[str], mean: Sequence[float], std: Sequence[float]) -> str:
    """The labels written one per line into ``folder`` (the label file both writers attach); the labels and the
    normalisation checked first (``MetadataError``)."""
    labels = [str(lab) for lab in labels]
    if any("\n" in lab for lab in labels):
        raise MetadataError("class labels must not contain newlines")
    if len(mean) != len(std):
        raise MetadataError(f"normalisation mean ({len(mean)} values) and std ({len(std)}) differ in length")
    path = os.path.join(folder, LABEL_FILE)
    with open(path, "w") as f:
        f.write("\n".join(labels) + "\n")
    return path


def _image_input_md(info: Any, fb: Any, buf: bytearray, mean: Sequence[float], std: Sequence[float],
                    grayscale: bool) -> Any:
    """The input image's metadata: normalisation per channel, colour space, tensor type."""
    from tensorflow_lite_support.metadata.python.metadata_writers import writer_utils

    return info.InputImageTensorMd(
        name="image", description="Input image, normalised as (pixel - mean) / std, then quantized "
                                  "with the input tensor's scale and zero point.",
        norm_mean=[float(v) for v in mean], norm_std=[float(v) for v in std],
        color_space_type=fb.ColorSpaceType.GRAYSCALE if grayscale else fb.ColorSpaceType.RGB,
        tensor_type=writer_utils.get_input_tensor_types(buf)[0])


def add_metadata(model: bytes, labels: Sequence[str], mean: Sequence[float], std: Sequence[float],
                 name: str = "tfmcu image classifier", description: str = "", version: str = "",
                 author: str = "tfmcu", grayscale: bool = False) -> bytes:
    """``model`` with image-classifier metadata: labels (one per output class), input normalisation per channel."""
    image_classifier, info, fb = _writers()
    with tempfile.TemporaryDirectory(prefix="tfmcu-md-") as tmp:
        label_path = _label_file(tmp, labels, mean, std)
        try:
            from tensorflow_lite_support.metadata.python.metadata_writers import writer_utils

            buf = bytearray(model)
            input_md = _image_input_md(info, fb, buf, mean, std, grayscale)
            output_md = info.ClassificationTensorMd(
                name="logits", description=f"Class scores (logits) of the {len(labels)} labels.",
                label_files=[info.LabelFileMd(file_path=label_path)],
                tensor_type=writer_utils.get_output_tensor_types(buf)[0])
            general_md = info.GeneralMd(name=name, version=version or None, description=description or None,
                                        author=author or None)
            writer = image_classifier.MetadataWriter.create_from_metadata_info(buf, general_md, input_md, output_md)
            return _fixed_zip_times(bytes(writer.populate()))
        except (ValueError, RuntimeError, TypeError) as e:
            raise MetadataError(f"cannot write the metadata: {str(e).splitlines()[0]}") from None


def add_detector_metadata(model: bytes, labels: Sequence[str], mean: Sequence[float], std: Sequence[float],
                          name: str = "tfmcu object detector", description: str = "", version: str = "",
                          author: str = "tfmcu", grayscale: bool = False) -> bytes:
    """``model`` (ending in TFLite_Detection_PostProcess, its four outputs the model's in the op's order) with
    tflite-support's object-detector metadata: the input normalisation, the four outputs, the labels (one per
    class) as the category output's label file."""
    _, info, fb = _writers()
    from tensorflow_lite_support.metadata.python.metadata_writers import object_detector, writer_utils

    n_labels = len(labels)
    with tempfile.TemporaryDirectory(prefix="tfmcu-md-") as tmp:
        label_path = _label_file(tmp, labels, mean, std)
        try:
            buf = bytearray(model)
            if len(writer_utils.get_output_tensor_types(buf)) != 4:
                raise MetadataError("a detector's metadata needs the 4 outputs of TFLite_Detection_PostProcess")
            input_md = _image_input_md(info, fb, buf, mean, std, grayscale)
            category_md = info.CategoryTensorMd(
                name="category", description=f"Class of each detected box, 0..{n_labels - 1} (float).",
                label_files=[info.LabelFileMd(file_path=label_path)])
            general_md = info.GeneralMd(name=name, version=version or None, description=description or None,
                                        author=author or None)
            writer = object_detector.MetadataWriter.create_from_metadata_info(
                buf, general_md, input_md, output_category_md=category_md)
            return _fixed_zip_times(bytes(writer.populate()))
        except (ValueError, RuntimeError, TypeError) as e:
            raise MetadataError(f"cannot write the metadata: {str(e).splitlines()[0]}") from None


def _fixed_zip_times(model: bytes) -> bytes:
    """The associated-files zip re-stamped with a fixed date (1980-01-01), so one model gives one file: the
    metadata populator stamps the current time, which made two otherwise identical exports differ."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(model))
        infos = zf.infolist()
        members = [(info, zf.read(info)) for info in infos]
    except zipfile.BadZipFile:
        return model
    if not infos:
        return model
    start = min(info.header_offset for info in infos)
    buf = io.BytesIO(model[:start])
    buf.seek(0, io.SEEK_END)
    with zipfile.ZipFile(buf, "a") as out:
        for info, payload in members:
            fixed = zipfile.ZipInfo(info.filename, date_time=(1980, 1, 1, 0, 0, 0))
            fixed.compress_type = info.compress_type
            fixed.external_attr = info.external_attr
            out.writestr(fixed, payload)
    return buf.getvalue()


def read_metadata(model: bytes) -> dict[str, Any]:
    """The model's TFLite metadata as a dict, plus ``associated_files`` and ``labels`` (from the label file)."""
    _writers()
    from tensorflow_lite_support.metadata.python import metadata

    try:
        disp = metadata.MetadataDisplayer.with_model_buffer(bytearray(model))
    except ValueError as e:
        raise MetadataError(f"no readable TFLite metadata ({str(e).splitlines()[0]})") from None
    md = json.loads(disp.get_metadata_json())
    files = list(disp.get_packed_associated_file_list())
    md["associated_files"] = files
    if LABEL_FILE in files:
        md["labels"] = disp.get_associated_file_buffer(LABEL_FILE).decode().splitlines()
    return md


def normalization(md: dict[str, Any]) -> tuple[list[float], list[float]] | None:
    """(mean, std) from ``read_metadata``'s dict, if the input carries a normalisation process unit."""
    for sg in md.get("subgraph_metadata", []):
        for t in sg.get("input_tensor_metadata", []):
            for pu in t.get("process_units", []):
                opts = pu.get("options", {})
                if "mean" in opts and "std" in opts:
                    return list(opts["mean"]), list(opts["std"])
    return None
