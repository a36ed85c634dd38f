"""``typing.NamedTuple``'s class syntax at a fraction of its cost: the runtime's record classes.

``class Settings(Record): strict: bool = False`` makes the same class ``typing.NamedTuple`` would
(a ``collections.namedtuple`` with the class's methods, docstring and defaults, its ``__module__``
and ``__annotations__``), and type checkers are told it is ``typing.NamedTuple`` itself. Why not
``typing.NamedTuple``: importing ``typing`` costs several milliseconds at start-up, and it makes each
field's annotation (a string, under ``from __future__ import annotations``) into a ``ForwardRef``,
compiling it: about 0.1 ms a field, milliseconds for the runtime's records, all paid by every
``import patchkit``. The annotations are kept as the strings they are; nothing here evaluates them.
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` is not imported at start-up; type checkers treat this name as True

if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    from collections import namedtuple

    #: As in ``typing``: what a record class may not define, and what is not copied onto the tuple class.
    _PROHIBITED = frozenset({"__new__", "__init__", "__slots__", "__getnewargs__", "_fields", "_field_defaults",
                             "_make", "_replace", "_asdict", "_source"})
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})

    class _RecordMeta(type):
        def __new__(mcs, name: str, bases: tuple, namespace: dict) -> type:
            if not bases:  # Record itself
                return super().__new__(mcs, name, bases, namespace)
            if bases != (Record,):
                raise TypeError(f"{name}: a Record class derives from Record alone")
            annotations = namespace.get("__annotations__", {})
            fields = tuple(annotations)
            defaults = []
            for field in fields:
                if field in namespace:
                    defaults.append(namespace[field])
                elif defaults:
                    raise TypeError(f"{name}: field {field!r} without a default follows a field with one")
            record = namedtuple(name, fields, defaults=defaults, module=namespace.get("__module__"))
            record.__annotations__ = dict(annotations)
            for key, value in namespace.items():
                if key in _PROHIBITED:
                    raise AttributeError(f"{name}: cannot overwrite the record attribute {key}")
                if key not in _SPECIAL and key not in fields:
                    setattr(record, key, value)
            return record

    class Record(metaclass=_RecordMeta):
        """Base of a record class (see the module doc): fields are its annotations, in order."""


__all__ = ["Record"]
