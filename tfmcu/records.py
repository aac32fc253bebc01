"""Typed results: the frozen dataclasses a flow returns, written as JSON and read back (``Record``).

A flow (fit, rewrite, verify, deploy, ...) returns a record; scripts, benches and plots read its attributes, and the
JSON files a pipeline writes are ``record.to_json()``. ``Cls.from_json(d)`` reads such a file back into the same
record (``from_json(r.to_json()) == r``), the types coming from the field annotations:

* a field's value goes to JSON as it is (numbers, strings, booleans, None), a nested record as its ``to_json()``,
  lists and tuples element by element (a tuple comes back as a tuple), dicts value by value;
* a field declared with ``optional()`` is left out of the JSON while it is None (a part a run did not produce, such
  as deploy's measured ``run`` without ``--run``), and ``present(when)`` leaves it out unless ``when(record)``, so the
  files keep their shape;
* ``from_json`` refuses a key no field declares (a file of another version is an error, never half read).

``Pair[T]``: a figure of the original and of the rewritten model (``verify``, ``rewrite``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R", bound="Record")
_WHEN = "tfmcu.records.when"  # field metadata: a predicate on the record, whether the field goes to JSON


def optional(default: Any = None) -> Any:
    """A field left out of the JSON while it is None (``default``: its value when the JSON has no such key)."""
    return dataclasses.field(default=default, metadata={_WHEN: None})


def present(when: Callable[[Any], bool], default: Any = None) -> Any:
    """A field written to JSON only when ``when(record)`` holds (e.g. a figure only a linked firmware has)."""
    return dataclasses.field(default=default, metadata={_WHEN: when})


def _dump(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, (list, tuple)):
        return [_dump(x) for x in v]
    if isinstance(v, dict):
        return {k: _dump(x) for k, x in v.items()}
    return v


def _load(tp: Any, v: Any, subst: dict[Any, Any]) -> Any:
    if isinstance(tp, TypeVar):
        tp = subst.get(tp, Any)
    if v is None or tp is Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        records = [a for a in options if isinstance(typing.get_origin(a) or a, type)
                   and issubclass(typing.get_origin(a) or a, Record)]
        if isinstance(v, dict) and records:
            return _load(records[0], v, subst)
        return _load(options[0], v, subst) if len(options) == 1 else v
    if origin in (list, tuple):
        item = args[0] if args else Any
        items = [_load(item, x, subst) for x in v]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        value = args[1] if len(args) == 2 else Any
        return {k: _load(value, x, subst) for k, x in v.items()}
    cls = origin or tp
    if isinstance(cls, type) and issubclass(cls, Record):
        inner = dict(zip(getattr(cls, "__parameters__", ()), [subst.get(a, a) for a in args]))
        return cls._from_json(v, inner)
    return v


class Record:
    """A dataclass with ``to_json()`` / ``from_json()`` (see the module docstring); subclasses are dataclasses."""

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if _WHEN in f.metadata:
                when = f.metadata[_WHEN]
                if (v is None) if when is None else not when(self):
                    continue
            out[f.name] = _dump(v)
        return out

    @classmethod
    def from_json(cls: type[R], d: dict[str, Any]) -> R:
        return cls._from_json(d, {})

    @classmethod
    def _from_json(cls: type[R], d: dict[str, Any], subst: dict[Any, Any]) -> R:
        if not isinstance(d, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(d).__name__}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"{cls.__name__}: unknown keys {', '.join(unknown)}")
        return cls(**{k: _load(hints[k], v, subst) for k, v in d.items()})  # type: ignore[call-arg]


@dataclass(frozen=True, kw_only=True)
class Pair(Record, Generic[T]):
    """A figure of the original model and of the rewritten one (a side is left out of the JSON when it has none)."""

    original: T | None = optional()
    rewritten: T | None = optional()
