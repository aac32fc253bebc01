"""Typed results: the frozen dataclasses a flow returns, written as JSON and read back (``Record``).

A flow (fit, rewrite, verify, deploy, train, ...) returns a record; scripts, benches and plots read its attributes,
and the JSON files a pipeline writes are ``record.to_json()``. ``Cls.from_json(d)`` reads such a file back into the
same record (``from_json(r.to_json()) == r``), the types coming from the field annotations:

* a field's value goes to JSON as it is (numbers, strings, booleans, None), a nested record as its ``to_json()``, any
  other dataclass (a run's options) as its fields, lists and tuples element by element (a tuple comes back as a
  tuple), dicts value by value;
* a field declared with ``optional()`` is left out of the JSON while it is None (a part a run did not produce, such
  as deploy's measured ``run`` without ``--run``), and ``present(when)`` leaves it out unless ``when(record)``, so the
  files keep their shape;
* ``named(key)`` (or ``optional(key=...)``): the field's JSON key is ``key``, not the field's name;
* ``flat()``: a nested record (or None) whose keys are the record's own, where the field stands (a report's section:
  the run's fields, then the task's); ``from_json`` gives it the keys its fields declare (None when there are none);
* ``extra()``: a dict of the keys no field declares (what a data set says of itself), written after the fields;
* ``coded(dump, load)``: a value that has its own JSON form (a network spec);
* ``from_json`` refuses a key no field declares (a file of another version is an error, never half read), unless the
  record has an ``extra()`` field; a record whose files had another shape before says how to read them in
  ``from_earlier`` (the keys of today's shape from those of an earlier one).

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
_KEY = "tfmcu.records.key"  # the field's JSON key
_FLAT = "tfmcu.records.flat"  # a nested record whose keys are the record's own
_EXTRA = "tfmcu.records.extra"  # a dict of the keys no field declares
_CODED = "tfmcu.records.coded"  # (dump, load): a value with its own JSON form


def _field(default: Any = dataclasses.MISSING, default_factory: Any = dataclasses.MISSING, **meta: Any) -> Any:
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={k: v for k, v in meta.items() if v is not None or k == _WHEN})


def optional(default: Any = None, key: str | None = None) -> Any:
    """A field left out of the JSON while it is None (``default``: its value when the JSON has no such key;
    ``key``: its JSON key, when not the field's name)."""
    return _field(default, **{_WHEN: None, _KEY: key})


def present(when: Callable[[Any], bool], default: Any = None) -> Any:
    """A field written to JSON only when ``when(record)`` holds (e.g. a figure only a linked firmware has)."""
    return _field(default, **{_WHEN: when})


def named(key: str, default: Any = dataclasses.MISSING) -> Any:
    """A field whose JSON key is ``key``."""
    return _field(default, **{_KEY: key})


def flat(default: Any = None) -> Any:
    """A nested record (or None) whose keys are the record's own (see the module docstring)."""
    return _field(default, **{_FLAT: True})


def extra() -> Any:
    """A dict of the keys no other field declares, written after the fields (see the module docstring)."""
    return _field(default_factory=dict, **{_EXTRA: True})


def coded(dump: Callable[[Any], Any], load: Callable[[Any], Any], default: Any = dataclasses.MISSING) -> Any:
    """A field written as ``dump(value)`` and read as ``load(json)`` (a type with a JSON form of its own)."""
    return _field(default, **{_CODED: (dump, load)})


def _dump(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_json()
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _dump(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_dump(x) for x in v]
    if isinstance(v, dict):
        return {k: _dump(x) for k, x in v.items()}
    return v


def _record_type(tp: Any) -> Any:
    """The record type a (possibly optional) annotation names, or None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        found = [_record_type(a) for a in typing.get_args(tp) if a is not type(None)]
        return next((a for a in found if a is not None), None)
    cls = typing.get_origin(tp) or tp
    return tp if isinstance(cls, type) and issubclass(cls, Record) else None


def _load(tp: Any, v: Any, subst: dict[Any, Any]) -> Any:
    if isinstance(tp, TypeVar):
        tp = subst.get(tp, Any)
    if v is None or tp is Any:
        return v
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        record = _record_type(tp)
        if isinstance(v, dict) and record is not None:
            return _load(record, v, subst)
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
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return _load_fields(cls, v, subst)
    return v


def _json_keys(cls: Any) -> list[str]:
    """The JSON keys a dataclass's fields declare (a flat field's: its record's)."""
    keys: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get(_FLAT):
            keys += _json_keys(typing.get_origin(_record_type(hints[f.name])) or _record_type(hints[f.name]))
        elif not f.metadata.get(_EXTRA):
            keys.append(f.metadata.get(_KEY, f.name))
    return keys


def _load_fields(cls: Any, d: Any, subst: dict[Any, Any]) -> Any:
    """A dataclass (a record or not) from the JSON its fields declare (see the module docstring)."""
    if not isinstance(d, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    used: set[str] = set()
    spare = None
    for f in dataclasses.fields(cls):
        m = f.metadata
        if m.get(_EXTRA):
            spare = f.name
        elif m.get(_FLAT):
            tp = _record_type(hints[f.name])
            part = {k: d[k] for k in _json_keys(typing.get_origin(tp) or tp) if k in d}
            if part:
                kwargs[f.name] = _load(tp, part, subst)
                used.update(part)
        elif m.get(_KEY, f.name) in d:
            key = m.get(_KEY, f.name)
            used.add(key)
            v = d[key]
            kwargs[f.name] = m[_CODED][1](v) if _CODED in m and v is not None else _load(hints[f.name], v, subst)
    unknown = [k for k in d if k not in used]
    if unknown and spare is None:
        raise ValueError(f"{cls.__name__}: unknown keys {', '.join(sorted(unknown))}")
    if spare is not None:
        kwargs[spare] = {k: d[k] for k in unknown}
    try:
        return cls(**kwargs)
    except TypeError as e:  # a key the file lacks and the field has no default for
        raise ValueError(f"{cls.__name__}: {e}") from None


class Record:
    """A dataclass with ``to_json()`` / ``from_json()`` (see the module docstring); subclasses are dataclasses."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        spare: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v, m = getattr(self, f.name), f.metadata
            if _WHEN in m:
                when = m[_WHEN]
                if (v is None) if when is None else not when(self):
                    continue
            if m.get(_EXTRA):
                spare = v
            elif m.get(_FLAT):
                out.update(v.to_json() if v is not None else {})
            else:
                out[m.get(_KEY, f.name)] = m[_CODED][0](v) if _CODED in m and v is not None else _dump(v)
        return {**out, **{k: _dump(v) for k, v in spare.items() if k not in out}}

    @classmethod
    def from_json(cls: type[R], d: dict[str, Any]) -> R:
        return cls._from_json(d, {})

    @classmethod
    def from_earlier(cls, d: dict[str, Any]) -> dict[str, Any]:
        """Today's JSON from a file of an earlier shape (a record whose files changed says how; default: as is)."""
        return d

    @classmethod
    def _from_json(cls: type[R], d: dict[str, Any], subst: dict[Any, Any]) -> R:
        if not isinstance(d, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(d).__name__}")
        return _load_fields(cls, cls.from_earlier(d), subst)


@dataclass(frozen=True, kw_only=True)
class Pair(Record, Generic[T]):
    """A figure of the original model and of the rewritten one (a side is left out of the JSON when it has none)."""

    original: T | None = optional()
    rewritten: T | None = optional()
