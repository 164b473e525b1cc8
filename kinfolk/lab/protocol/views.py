"""Views of a unit's records that hide the test split, so selection code cannot read what it must not see.

A selection stage (choosing a run, a learning rate, a temperature, a checkpoint, a patch order, a routing
threshold) receives a `SelectionView`: the record with every field named like a test split (`test`, and any key
in `hidden`) made unreachable. Reading one raises `TestFieldAccess`; nested mappings, sequences and dataclasses
come back wrapped, so no ordinary path (indexing, `.get`, `in`, attributes, iteration, slices) leads around it.
It guards against reading test by mistake or by habit, not against deliberate introspection of its private slots.

>>> view = SelectionView({"validation": {"score": 0.8}, "test": {"score": 0.7}, "runs": [{"test": 1}]})
>>> view["validation"]["score"]
0.8
>>> view["test"]  # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
...
TestFieldAccess: selection read the test field 'test'
>>> sorted(view)  # iteration does not list hidden fields either
['runs', 'validation']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

TEST_FIELDS = frozenset({"test"})


class TestFieldAccess(PermissionError):
    """Selection code asked for a field of the test split. Not a `KeyError`, so `view.get("test")` and
    `"test" in view` raise it too instead of quietly answering."""

    __test__ = False  # not a pytest test class, whatever its name


class SelectionView(Mapping):
    """Read-only view of a record (mapping, sequence or dataclass) without its test fields."""

    __slots__ = ("_data", "_hidden")

    def __init__(self, data: Any, hidden: frozenset[str] = TEST_FIELDS) -> None:
        object.__setattr__(self, "_data", data)
        object.__setattr__(self, "_hidden", frozenset(hidden))

    def _refuse(self, key: Any) -> None:
        if isinstance(key, str) and key in self._hidden:
            raise TestFieldAccess(f"selection read the test field {key!r}")

    def _fields(self) -> Mapping[str, Any]:
        data = self._data
        if dataclasses.is_dataclass(data) and not isinstance(data, type):
            return {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
        return data

    def __getitem__(self, key: Any) -> Any:
        self._refuse(key)
        return wrap(self._fields()[key], self._hidden)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse(name)
        try:
            return wrap(self._fields()[name], self._hidden)
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise TypeError("a selection view is read-only")

    def __iter__(self) -> Iterator[Any]:
        return (key for key in self._fields() if not (isinstance(key, str) and key in self._hidden))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"SelectionView(hiding {sorted(self._hidden)})"


class _SequenceView(Sequence):
    __slots__ = ("_hidden", "_items")

    def __init__(self, items: Sequence[Any], hidden: frozenset[str]) -> None:
        self._items, self._hidden = items, hidden

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return _SequenceView(self._items[index], self._hidden)
        return wrap(self._items[index], self._hidden)

    def __len__(self) -> int:
        return len(self._items)


def wrap(value: Any, hidden: frozenset[str] = TEST_FIELDS) -> Any:
    """`value` as selection may see it: containers and dataclasses wrapped, scalars and strings as they are."""
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    if isinstance(value, Mapping) or (dataclasses.is_dataclass(value) and not isinstance(value, type)):
        return SelectionView(value, hidden)
    if isinstance(value, Sequence):
        return _SequenceView(value, hidden)
    return value
