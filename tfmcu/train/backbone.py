"""``--init_backbone``: a run starts from the layers another run of the same spec family trained, e.g. a detector's
backbone from a classifier (``train --task=detection --init_backbone=RUN_DIR|weights.h5``).

* ``load_backbone(model, path)`` (``path``: the file ``tfmcu.train.config.backbone_weights`` resolves, a run
  folder's ``model_float_weights.h5``, which every ``train`` run writes, or an .h5 weights file): every layer of
  ``model`` that has weights takes them from the file's layer of the same name when their shapes are equal (Keras'
  own names: ``stem_conv``, ``b3_expand``, ...; a classifier's head and a detector's head have other names or shapes
  and are left as initialised); returns which layers loaded (``tfmcu.train.report.BackboneLoad``).
"""

from __future__ import annotations

from typing import Any

import h5py

from tfmcu.train.config import TrainError
from tfmcu.train.report import BackboneLoad


def _file_layers(path: str) -> dict[str, list[Any]]:
    """The weights of every layer in a Keras .h5 weights file (``save_weights`` to a name not ending .weights.h5), by
    layer name."""
    try:
        with h5py.File(path, "r") as f:
            group = f["model_weights"] if "model_weights" in f else f  # (a whole saved model keeps them below)
            if "layer_names" not in group.attrs:
                raise TrainError(f"--init_backbone={path}: weights in Keras' newer layout, which names no layers "
                                 "(give a training run's folder, or weights saved to a name ending .h5 but not "
                                 ".weights.h5)")
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in group.attrs["layer_names"]]
            out = {}
            for name in names:
                g = group[name]
                weights = [w.decode() if isinstance(w, bytes) else str(w) for w in g.attrs["weight_names"]]
                out[name] = [g[w][()] for w in weights]
            return out
    except (OSError, KeyError) as e:
        raise TrainError(f"--init_backbone={path}: not a Keras .h5 weights file ({str(e).splitlines()[0][:100]})") \
            from None


def load_backbone(model: Any, path: str, assign: bool = True) -> BackboneLoad:
    """``model``'s layers loaded from the weights file ``path`` by name and shape (see the module docstring);
    ``assign=False``: which would load, nothing changed."""
    stored = _file_layers(path)
    loaded, not_loaded = [], []
    for layer in model.layers:
        own = layer.get_weights()
        if not own:
            continue
        theirs = stored.get(layer.name)
        if theirs is not None and [w.shape for w in theirs] == [w.shape for w in own]:
            if assign:
                layer.set_weights(theirs)
            loaded.append(layer.name)
        else:
            not_loaded.append(layer.name)
    if not loaded:
        raise TrainError(f"--init_backbone={path}: no layer of this model has a layer of the same name and shapes "
                         f"there (a run of another spec family?)")
    return BackboneLoad(source=path, loaded=loaded, not_loaded=not_loaded)
