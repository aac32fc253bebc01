"""Resolve what a user names with ``--model`` (preset, spec JSON, .tflite, Keras file) into the graph IR."""

from __future__ import annotations

import os
from dataclasses import dataclass

from tfmcu.errors import TfmcuError
from tfmcu.graph import ir
from tfmcu.graph.from_keras import load_keras
from tfmcu.graph.from_spec import from_spec
from tfmcu.graph.from_tflite import from_tflite
from tfmcu.nets import presets
from tfmcu.nets.spec import NetSpec, SpecError

KERAS_SUFFIXES = (".keras", ".h5", ".hdf5")


class ModelError(TfmcuError):
    """The model argument cannot be used; one line naming the file or preset and the problem."""


@dataclass
class LoadedModel:
    graph: ir.Graph
    kind: str  # "preset" | "spec" | "tflite" | "keras"
    spec: NetSpec | None = None
    path: str | None = None


def load_spec(model: str, resolution: int | None = None, width: float | None = None,
              num_classes: int | None = None) -> NetSpec:
    """A preset name or a spec JSON file as a NetSpec, with optional overrides."""
    if model.endswith(".json"):
        if not os.path.isfile(model):
            raise ModelError(f"{model}: no such file")
        try:
            spec = NetSpec.load(model)
        except SpecError as e:
            raise ModelError(f"{model}: {e}") from None
        if width is not None:
            spec = spec.replace(width_multiplier=width)
    else:
        try:
            spec = presets.get_preset(model, width=width)
        except ValueError as e:
            raise ModelError(str(e)) from None
    changes = {}
    if resolution is not None:
        changes["resolution"] = resolution
    if num_classes is not None:
        changes["head"] = spec.head.__class__(**{**spec.head.__dict__, "num_classes": num_classes})
    spec = spec.replace(**changes) if changes else spec
    try:
        return spec.validate()
    except SpecError as e:
        raise ModelError(f"{model}: {e}") from None


def load_model(model: str, resolution: int | None = None, width: float | None = None,
               num_classes: int | None = None) -> LoadedModel:
    if model.endswith(".tflite") or model.endswith(KERAS_SUFFIXES):
        if not os.path.isfile(model):
            raise ModelError(f"{model}: no such file")
        given = [n for n, v in (("--resolution", resolution), ("--width", width),
                                ("--num_classes", num_classes)) if v is not None]
        if given:
            raise ModelError(f"{model}: {', '.join(given)} apply only to presets and spec JSON files; "
                             f"a model file has its own")
        try:
            if model.endswith(".tflite"):
                return LoadedModel(from_tflite(model), "tflite", path=model)
            return LoadedModel(load_keras(model), "keras", path=model)
        except ir.GraphError as e:
            msg = str(e)
            raise ModelError(msg if model in msg else f"{model}: {msg}") from None
    spec = load_spec(model, resolution, width, num_classes)
    return LoadedModel(from_spec(spec), "spec" if model.endswith(".json") else "preset", spec=spec,
                       path=model if model.endswith(".json") else None)
