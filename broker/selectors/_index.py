"""`SubscriptionIndex`: every subscription a message matches, without evaluating them all.

Theory of operation
-------------------
A selector can only match a message if every conjunct of its top-level AND can be TRUE. Some
conjuncts say so from the selector text alone, and those are what the index files a
subscription under, so that one message's fields look up their candidates by hash:

1. *Key* conjuncts: `x = 'lit'`, `x IN ('a', 'b')` (exact strings), LDAP `(x=lit)` (caseless),
   and `x = 5` (numeric, so '5.0' finds it too). The subscription is filed under each
   (identifier, key) pair; a message finds it only through an instance of `x` equal to a key.
2. *Presence* conjuncts: any other atom (or `IS NOT NULL`). An atom over a missing identifier is
   UNKNOWN or FALSE, never TRUE, so the subscription is filed under that identifier and only
   considered for messages that carry it.
3. Everything else (a top-level OR, NOT, IS NULL, the empty selector) is evaluated for every
   message: the fallback list.

A candidate found through a key conjunct is then checked against its *residual*, the other
conjuncts compiled on their own (none at all for a bare `symbol = 'XMPL'`); presence and fallback
candidates are evaluated in full. So the cost per message is the number of candidates, not of
subscriptions: with most selectors keyed on a field of many values it grows with
subscriptions / distinct keys, which is what "sublinear" means here.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Generic, TypeVar

from ._ast import (
    And,
    Atom,
    Compare,
    Cond,
    Const,
    Field,
    FieldType,
    InList,
    IsNull,
    Mode,
    NumLit,
    StrLit,
)
from ._eval import compile_condition, to_number

if TYPE_CHECKING:
    from . import Selector

__all__ = ["SubscriptionIndex"]

K = TypeVar("K", bound=Hashable)
_V = TypeVar("_V")
_Fields = Mapping[str, Sequence[str]]
_Residual = Callable[[_Fields], bool | None] | None


class _Table(Enum):
    EXACT = "exact"
    CASELESS = "caseless"
    NUMBER = "number"


@dataclass(frozen=True, slots=True)
class _Keys:
    table: _Table
    name: str
    keys: tuple[str | float, ...]


@dataclass(frozen=True, slots=True)
class _Entry:
    selector: Selector
    residual: _Residual
    keys: _Keys | None
    presence: str | None


def _keys_of(cond: Cond) -> _Keys | None:
    if not isinstance(cond, Atom):
        return None
    pred = cond.predicate
    if isinstance(pred, InList) and not pred.negated:
        return _Keys(_Table.EXACT, pred.value.name, tuple(dict.fromkeys(pred.items)))
    if not isinstance(pred, Compare) or pred.op.value != "=":
        return None
    field, other = pred.left, pred.right
    if not isinstance(field, Field):
        field, other = other, field
    if not isinstance(field, Field):
        return None
    if pred.mode is Mode.STRING and isinstance(other, StrLit):
        return _Keys(_Table.EXACT, field.name, (other.value,))
    if pred.mode is Mode.CASELESS and isinstance(other, StrLit):
        return _Keys(_Table.CASELESS, field.name, (other.value.lower(),))
    if (pred.mode is Mode.NUMBER and isinstance(other, NumLit)
            and field.type in (FieldType.TEXT, FieldType.NUMBER) and other.value == other.value):
        return _Keys(_Table.NUMBER, field.name, (other.value,))
    return None


def _plan(selector: Selector) -> _Entry:
    cond = selector.condition
    conjuncts = list(cond.operands) if isinstance(cond, And) else [cond]
    keyed = [(i, k) for i, c in enumerate(conjuncts) if (k := _keys_of(c)) is not None]
    if keyed:
        i, keys = min(keyed, key=lambda pair: len(pair[1].keys))
        rest = conjuncts[:i] + conjuncts[i + 1 :]
        residual = None if not rest else compile_condition(
            rest[0] if len(rest) == 1 else And(tuple(rest)))
        return _Entry(selector, residual, keys, None)
    for c in conjuncts:
        if isinstance(c, Atom) and c.fields:
            return _Entry(selector, selector.evaluate, None, c.fields[0])
        if isinstance(c, IsNull) and c.negated:
            return _Entry(selector, selector.evaluate, None, c.name)
    if isinstance(cond, Const) and cond.value is True:
        return _Entry(selector, None, None, None)
    return _Entry(selector, selector.evaluate, None, None)


class SubscriptionIndex(Generic[K]):
    """Compiled selectors filed by key (e.g. `(subscriber, subscription_id)`) for fast matching.

    Not thread-safe for concurrent `add`/`remove` and `match`; one index per topic, owned by
    the topic's task, is the intended use.
    """

    def __init__(self) -> None:
        self._entries: dict[K, _Entry] = {}
        self._tables: dict[_Table, dict[str, dict[str | float, set[K]]]] = {
            t: {} for t in _Table
        }
        self._presence: dict[str, set[K]] = {}
        self._fallback: set[K] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def add(self, key: K, selector: Selector) -> None:
        """File `selector` under `key`, replacing any selector already filed under it."""
        if key in self._entries:
            self.remove(key)
        entry = _plan(selector)
        self._entries[key] = entry
        if entry.keys is not None:
            by_value = self._tables[entry.keys.table].setdefault(entry.keys.name, {})
            for value in entry.keys.keys:
                by_value.setdefault(value, set()).add(key)
        elif entry.presence is not None:
            self._presence.setdefault(entry.presence, set()).add(key)
        else:
            self._fallback.add(key)

    def remove(self, key: K) -> None:
        """Forget `key`; KeyError if it is not filed."""
        entry = self._entries.pop(key)
        if entry.keys is not None:
            by_value = self._tables[entry.keys.table][entry.keys.name]
            for value in entry.keys.keys:
                bucket = by_value[value]
                bucket.discard(key)
                if not bucket:
                    del by_value[value]
            if not by_value:
                del self._tables[entry.keys.table][entry.keys.name]
        elif entry.presence is not None:
            bucket = self._presence[entry.presence]
            bucket.discard(key)
            if not bucket:
                del self._presence[entry.presence]
        else:
            self._fallback.discard(key)

    def match(self, fields: _Fields) -> set[K]:
        """Every key whose selector matches a message's stored fields."""
        entries = self._entries
        matched: set[K] = set()
        candidates: set[K] = set()
        for table, by_name in self._tables.items():
            for name, by_value in self._iter_present(by_name, fields):
                for value in fields[name]:
                    key_value: str | float | None
                    if table is _Table.EXACT:
                        key_value = value
                    elif table is _Table.CASELESS:
                        key_value = value.lower()
                    else:
                        key_value = to_number(value)
                    bucket = by_value.get(key_value) if key_value is not None else None
                    if bucket:
                        candidates.update(bucket)
        for key in candidates:
            residual = entries[key].residual
            if residual is None or residual(fields) is True:
                matched.add(key)
        for _, keys in self._iter_present(self._presence, fields):
            for key in keys:
                if entries[key].selector.evaluate(fields) is True:
                    matched.add(key)
        for key in self._fallback:
            residual = entries[key].residual
            if residual is None or residual(fields) is True:
                matched.add(key)
        return matched

    @staticmethod
    def _iter_present(
        by_name: Mapping[str, _V], fields: _Fields
    ) -> Iterable[tuple[str, _V]]:
        # Walk whichever side is smaller: few indexed names, or a message with few fields.
        if len(by_name) <= len(fields):
            for name, value in by_name.items():
                if fields.get(name):
                    yield name, value
        else:
            for name in fields:
                found = by_name.get(name)
                if found is not None and fields[name]:
                    yield name, found

