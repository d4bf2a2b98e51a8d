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

Subscriptions whose compiled conditions are equal (the trees are hashable) share one group,
filed and evaluated once per message however many subscribers hold it: popular selectors are
common, and this makes their cost independent of their popularity.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

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


class _Group:
    """All subscriptions sharing one condition: it is filed, and evaluated, once."""

    __slots__ = ("condition", "evaluate", "keys", "presence", "residual", "subscribers")

    def __init__(self, selector: Selector) -> None:
        self.condition = selector.condition
        self.evaluate = selector.evaluate
        self.keys, self.presence, self.residual = _plan(selector)
        self.subscribers: set[Any] = set()


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


def _plan(selector: Selector) -> tuple[_Keys | None, str | None, _Residual]:
    """(keys to file under, or an identifier to file under, and what to evaluate on a hit)."""
    cond = selector.condition
    conjuncts = list(cond.operands) if isinstance(cond, And) else [cond]
    keyed = [(i, k) for i, c in enumerate(conjuncts) if (k := _keys_of(c)) is not None]
    if keyed:
        i, keys = min(keyed, key=lambda pair: len(pair[1].keys))
        rest = conjuncts[:i] + conjuncts[i + 1 :]
        residual = None if not rest else compile_condition(
            rest[0] if len(rest) == 1 else And(tuple(rest)))
        return keys, None, residual
    for c in conjuncts:
        if isinstance(c, Atom) and c.fields:
            return None, c.fields[0], selector.evaluate
        if isinstance(c, IsNull) and c.negated:
            return None, c.name, selector.evaluate
    if isinstance(cond, Const) and cond.value is True:
        return None, None, None
    return None, None, selector.evaluate


class SubscriptionIndex(Generic[K]):
    """Compiled selectors filed by key (e.g. `(subscriber, subscription_id)`) for fast matching.

    Not thread-safe for concurrent `add`/`remove` and `match`; one index per topic, owned by
    the topic's task, is the intended use.
    """

    def __init__(self) -> None:
        self._by_key: dict[K, _Group] = {}
        self._groups: dict[Cond, _Group] = {}
        self._tables: dict[_Table, dict[str, dict[str | float, set[_Group]]]] = {
            t: {} for t in _Table
        }
        self._presence: dict[str, set[_Group]] = {}
        self._fallback: set[_Group] = set()

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key

    def add(self, key: K, selector: Selector) -> None:
        """File `selector` under `key`, replacing any selector already filed under it."""
        if key in self._by_key:
            self.remove(key)
        group = self._groups.get(selector.condition)
        if group is None:
            group = self._groups[selector.condition] = _Group(selector)
            self._file(group, add=True)
        group.subscribers.add(key)
        self._by_key[key] = group

    def remove(self, key: K) -> None:
        """Forget `key`; KeyError if it is not filed."""
        group = self._by_key.pop(key)
        group.subscribers.discard(key)
        if not group.subscribers:
            del self._groups[group.condition]
            self._file(group, add=False)

    def _file(self, group: _Group, add: bool) -> None:
        buckets: list[tuple[dict[Any, set[_Group]], Any]] = []
        if group.keys is not None:
            by_value = self._tables[group.keys.table].setdefault(group.keys.name, {})
            buckets = [(by_value, value) for value in group.keys.keys]
        elif group.presence is not None:
            buckets = [(self._presence, group.presence)]
        elif add:
            self._fallback.add(group)
        else:
            self._fallback.discard(group)
        for table, slot in buckets:
            if add:
                table.setdefault(slot, set()).add(group)
            else:
                table[slot].discard(group)
                if not table[slot]:
                    del table[slot]
        if group.keys is not None and not add:
            tables = self._tables[group.keys.table]
            if not tables[group.keys.name]:
                del tables[group.keys.name]

    def match(self, fields: _Fields) -> set[K]:
        """Every key whose selector matches a message's stored fields."""
        matched: set[K] = set()
        candidates: set[_Group] = set()
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
        for _, groups in self._iter_present(self._presence, fields):
            candidates.update(groups)
        candidates.update(self._fallback)
        for group in candidates:
            residual = group.residual
            if residual is None or residual(fields) is True:
                matched.update(group.subscribers)
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

