"""Training checkpoints: one per epoch (the latest kept) and ``state.json`` saying where a run is, for ``--resume``."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from tfmcu.files import write_outputs
from tfmcu.train.config import TrainError

STATE_FILE = "state.json"
STATE_VERSION = 1


class Checkpoints:
    """One checkpoint per epoch under ``folder`` (the latest kept), and ``state.json`` saying where we are.

    ``phases``: the names of the run's phases (training: float, then QAT; the supernet: largest, then supernet).
    ``write_folder`` (default ``folder``) is where new checkpoints go: non-chief workers of a multi-worker run must
    save too (collective ops) but into a private folder; everyone resumes from the chief's ``folder``."""

    def __init__(self, folder: str, fingerprint: str, log: Callable[[str], None], write_folder: str | None = None,
                 phases: tuple[str, ...] = ("float", "qat")):
        self.folder = folder
        self.phases = phases
        self.write_folder = write_folder or folder
        self.fingerprint = fingerprint
        self.log = log
        self.state_path = os.path.join(folder, STATE_FILE)

    def load_state(self) -> dict[str, Any] | None:
        if not os.path.exists(self.state_path):
            return None
        try:
            with open(self.state_path) as f:
                state = json.load(f)
            ok = (isinstance(state, dict) and state.get("version") == STATE_VERSION
                  and state.get("phase") in self.phases and isinstance(state.get("epoch"), int)
                  and isinstance(state.get("history"), dict) and isinstance(state.get("checkpoint"), str))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TrainError(f"{self.state_path}: corrupted checkpoint state ({type(e).__name__}); delete "
                             f"{self.folder} or run without --resume") from None
        if not ok:
            raise TrainError(f"{self.state_path}: corrupted checkpoint state (missing fields); delete {self.folder} "
                             f"or run without --resume")
        if state.get("fingerprint") != self.fingerprint:
            raise TrainError(f"{self.folder}: the checkpoint was written for another model, data set or recipe; "
                             f"run with the same settings, or without --resume to start over")
        return state

    def save(self, ckpt, phase: str, epoch: int, history: dict[str, Any], float_final: str | None) -> None:
        name = f"{phase}-{epoch:04d}"
        os.makedirs(self.write_folder, exist_ok=True)
        ckpt.write(os.path.join(self.write_folder, name))
        state = {"version": STATE_VERSION, "fingerprint": self.fingerprint, "phase": phase, "epoch": epoch,
                 "checkpoint": name, "float_final": float_final, "history": history}
        write_outputs({os.path.join(self.write_folder, STATE_FILE): state})
        self._prune(keep={name, float_final})

    def write_extra(self, ckpt, name: str) -> str:
        os.makedirs(self.write_folder, exist_ok=True)
        ckpt.write(os.path.join(self.write_folder, name))
        return name

    def restore(self, ckpt, name: str, what: str) -> None:
        import tensorflow as tf

        prefix = os.path.join(self.folder, name)
        try:
            status = ckpt.read(prefix)
            status.assert_existing_objects_matched()
            status.expect_partial()  # every object of ours matched; values we do not restore (an optimizer) are fine
        except (tf.errors.OpError, ValueError, AssertionError, OSError, IndexError, KeyError, TypeError) as e:
            # (a truncated data file surfaces as IndexError from the checkpoint reader)
            msg = getattr(e, "message", None) or str(e)
            raise TrainError(f"{prefix}: corrupted or incompatible {what} checkpoint ({type(e).__name__}: "
                             f"{msg.splitlines()[0][:160] if msg else ''}); delete {self.folder} or run without "
                             f"--resume") from None

    def _prune(self, keep: set[str | None]) -> None:
        for f in os.listdir(self.write_folder):
            base = f.split(".")[0]
            if f == STATE_FILE or base in keep or f.startswith(".tmp-"):
                continue
            if base.startswith(tuple(f"{p}-" for p in self.phases)) and (".index" in f or ".data-" in f):
                os.unlink(os.path.join(self.write_folder, f))
