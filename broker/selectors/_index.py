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
   considered for messages that carry it. (Not any identifier: `x NOT BETWEEN lo AND hi` is
   TRUE without `lo` when x > hi, so it is filed by `required_fields`, here `x`.)
3. Everything else (a top-level OR, NOT, IS NULL, the empty selector) is evaluated for every
   message: the fallback list.

A candidate found through a key conjunct is then checked against its *residual*, the other
conjuncts compiled on their own (none at all for a bare `symbol = 'XMPL'`); presence and fallback
candidates are evaluated in full. So the cost per message is the number of candidates, not of
subscriptions: with most selectors keyed on a field of many values it grows with
subscriptions / distinct keys, which is what "sublinear" means here.

*Threshold* conjuncts: a numeric comparison of one identifier with a number literal (`f > c`,
`f >= c`, `f < c`, `f <= c`, either way round, or `f BETWEEN lo AND hi`). By the any-instance
rule `f > c` is TRUE iff some instance parses as a number above c, i.e. iff the largest numeric
instance is (non-numeric instances are UNKNOWN, never TRUE; the number rule is `to_number`'s,
which never gives NaN and gives inf for `1e400`, compared exactly as the evaluator does). So
within a bucket (a key, or for unkeyed selectors the identifier itself) such groups are kept in
a sorted array of thresholds per (identifier, direction), and a message's max or min numeric
instance picks the passing ones by bisection instead of evaluating each. A BETWEEN is filed
as `f >= lo`, which is necessary but not sufficient over several instances, so it is also kept
in the residual. Further comparisons of that shape in the same selector are checked against the
message's per-identifier (min, max), exactly (one on the threshold's own identifier, as in
`m > lo AND m < hi`, rides in the array beside the threshold and is filtered in the same
pass); whatever else remains is compiled and evaluated.
Thresholds that are NaN never enter the arrays (such conjuncts stay in the residual).

Subscriptions whose compiled conditions are equal (the trees are hashable) share one group,
filed and evaluated once per message however many subscribers hold it: popular selectors are
common, and this makes their cost independent of their popularity.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._ast import (
    And,
    Atom,
    Between,
    CmpOp,
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
    required_fields,
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


# Threshold directions: what a message's numeric instances must do for `f op c` to be TRUE.
_GT, _GE, _LT, _LE, _NONE = 0, 1, 2, 3, -1  # max > c, max >= c, min < c, min <= c
_DIRECTION = {CmpOp.GT: _GT, CmpOp.GE: _GE, CmpOp.LT: _LT, CmpOp.LE: _LE}
_MIRRORED = {CmpOp.GT: CmpOp.LT, CmpOp.GE: CmpOp.LE, CmpOp.LT: CmpOp.GT, CmpOp.LE: CmpOp.GE}
#: (identifier, direction, threshold)
_Threshold = tuple[str, int, float]
#: identifier -> (min, max) of its numeric instances, or None if it has none
_Stats = dict[str, tuple[float, float] | None]


def _threshold_of(cond: Cond) -> tuple[_Threshold, bool] | None:
    """(threshold, exact) for a numeric one-identifier comparison with a literal, else None.

    `exact`: the threshold alone decides the conjunct (a comparison); a BETWEEN's `>= lo` is
    only necessary, as its two bounds must hold for the same instance.
    """
    if not isinstance(cond, Atom) or len(cond.fields) != 1:
        return None
    pred = cond.predicate
    if isinstance(pred, Between):
        if (pred.negated or not isinstance(pred.value, Field)
                or not isinstance(pred.low, NumLit) or not isinstance(pred.high, NumLit)
                or math.isnan(pred.low.value) or math.isnan(pred.high.value)):
            return None
        return (pred.value.name, _GE, pred.low.value), False
    if not isinstance(pred, Compare) or pred.mode is not Mode.NUMBER:
        return None
    op, field, const = pred.op, pred.left, pred.right
    if isinstance(field, NumLit) and op in _MIRRORED:
        op, field, const = _MIRRORED[op], const, field
    if (op not in _DIRECTION or not isinstance(field, Field) or not isinstance(const, NumLit)
            or math.isnan(const.value)):
        return None
    return (field.name, _DIRECTION[op], const.value), True


def _stats(fields: _Fields, name: str, cache: _Stats) -> tuple[float, float] | None:
    """(min, max) of `name`'s instances that are numbers under selectors.md, memoized."""
    if name in cache:
        return cache[name]
    low: float | None = None
    high = 0.0
    for text in fields.get(name, ()):
        n = to_number(text)
        if n is None:
            continue
        if low is None:
            low = high = n
        elif n < low:
            low = n
        elif n > high:
            high = n
    result = None if low is None else (low, high)
    cache[name] = result
    return result


#: A check: (identifier, 0 for its min or 1 for its max, comparison, threshold).
_Check = tuple[str, int, "_Test", float]
_Test = Callable[[float, float], bool]
_CHECK: dict[int, tuple[int, _Test]] = {
    _GT: (1, operator.gt), _GE: (1, operator.ge), _LT: (0, operator.lt), _LE: (0, operator.le)}


_DIRECTION_OF: dict[_Test, int] = {test: direction for direction, (_, test) in _CHECK.items()}


def _check(threshold: _Threshold) -> _Check:
    name, direction, value = threshold
    side, test = _CHECK[direction]
    return name, side, test, value


class _Group:
    """All subscriptions sharing one condition: it is filed, and evaluated, once."""

    __slots__ = ("checks", "condition", "evaluate", "keys", "presence", "residual", "second",
                 "subscribers", "threshold")

    def __init__(self, selector: Selector) -> None:
        self.condition = selector.condition
        self.evaluate = selector.evaluate
        self.keys, self.presence, self.threshold, self.checks, self.residual = _plan(selector)
        # An exact check on the threshold's own identifier (`m > lo AND m < hi`) is kept
        # beside the threshold, so that ranges are filtered in one pass over the array.
        self.second: tuple[int, float] | None = None
        if self.threshold is not None:
            for i, (name, _side, test, limit) in enumerate(self.checks):
                if name == self.threshold[0]:
                    self.second = (_DIRECTION_OF[test], limit)
                    self.checks = self.checks[:i] + self.checks[i + 1 :]
                    break
        self.subscribers: set[Any] = set()


class _Sorted:
    """Groups in ascending threshold order (parallel lists, for bisection)."""

    __slots__ = ("groups", "seconds", "thresholds")

    def __init__(self) -> None:
        self.thresholds: list[float] = []
        self.groups: list[_Group] = []
        self.seconds: list[float] = []  # each group's second threshold, if the array has them

    def add(self, group: _Group) -> None:
        assert group.threshold is not None
        value = group.threshold[2]
        i = bisect_right(self.thresholds, value)
        self.thresholds.insert(i, value)
        self.groups.insert(i, group)
        self.seconds.insert(i, 0.0 if group.second is None else group.second[1])

    def remove(self, group: _Group) -> None:
        assert group.threshold is not None
        i = bisect_left(self.thresholds, group.threshold[2])
        while self.groups[i] is not group:
            i += 1
        del self.thresholds[i]
        del self.groups[i]
        del self.seconds[i]

    def passing(self, direction: int, second: int, bounds: tuple[float, float]) -> list[_Group]:
        """The groups whose threshold(s) a message with these (min, max) numbers passes."""
        low, high = bounds
        if direction == _GT:
            cut = slice(bisect_left(self.thresholds, high))
        elif direction == _GE:
            cut = slice(bisect_right(self.thresholds, high))
        elif direction == _LT:
            cut = slice(bisect_right(self.thresholds, low), None)
        else:
            cut = slice(bisect_left(self.thresholds, low), None)
        groups, seconds = self.groups[cut], self.seconds[cut]
        if second == _GT:
            return [g for g, c in zip(groups, seconds, strict=True) if high > c]
        if second == _GE:
            return [g for g, c in zip(groups, seconds, strict=True) if high >= c]
        if second == _LT:
            return [g for g, c in zip(groups, seconds, strict=True) if low < c]
        if second == _LE:
            return [g for g, c in zip(groups, seconds, strict=True) if low <= c]
        return groups


class _Bucket:
    """What one slot files: groups to check by residual, and groups filed by threshold."""

    __slots__ = ("plain", "ranges")

    def __init__(self) -> None:
        self.plain: set[_Group] = set()
        #: (identifier, direction, second direction or _NONE) -> groups by threshold
        self.ranges: dict[tuple[str, int, int], _Sorted] = {}

    @staticmethod
    def _slot(group: _Group) -> tuple[str, int, int]:
        assert group.threshold is not None
        name, direction, _ = group.threshold
        return name, direction, _NONE if group.second is None else group.second[0]

    def add(self, group: _Group) -> None:
        if group.threshold is None:
            self.plain.add(group)
        else:
            self.ranges.setdefault(self._slot(group), _Sorted()).add(group)

    def remove(self, group: _Group) -> None:
        if group.threshold is None:
            self.plain.discard(group)
        else:
            slot = self._slot(group)
            self.ranges[slot].remove(group)
            if not self.ranges[slot].groups:
                del self.ranges[slot]

    def __bool__(self) -> bool:
        return bool(self.plain or self.ranges)

    def scan(self, fields: _Fields, stats: _Stats, candidates: set[_Group],
             passed: set[_Group]) -> None:
        candidates.update(self.plain)
        for (name, direction, second), ranged in self.ranges.items():
            bounds = _stats(fields, name, stats)
            if bounds is not None:
                passed.update(ranged.passing(direction, second, bounds))


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


_Plan = tuple[_Keys | None, str | None, _Threshold | None, tuple[_Check, ...], _Residual]


def _plan(selector: Selector) -> _Plan:
    """(keys to file under, or an identifier to file under; a threshold to file by; exact
    threshold checks and a residual to evaluate on a hit)."""
    cond = selector.condition
    conjuncts = list(cond.operands) if isinstance(cond, And) else [cond]
    keyed = [(i, k) for i, c in enumerate(conjuncts) if (k := _keys_of(c)) is not None]
    keys: _Keys | None = None
    rest = conjuncts
    if keyed:
        i, keys = min(keyed, key=lambda pair: len(pair[1].keys))
        rest = conjuncts[:i] + conjuncts[i + 1 :]
    threshold: _Threshold | None = None
    checks: list[_Check] = []
    others: list[Cond] = []
    for c in rest:
        found = _threshold_of(c)
        if found is not None and threshold is None:
            threshold = found[0]
            if not found[1]:
                others.append(c)
        elif found is not None and found[1]:
            checks.append(_check(found[0]))
        else:
            others.append(c)
    if keys is not None or threshold is not None:
        residual = None if not others else compile_condition(
            others[0] if len(others) == 1 else And(tuple(others)))
        return keys, None, threshold, tuple(checks), residual
    for c in conjuncts:
        if isinstance(c, Atom) and (required := required_fields(c)):
            return None, required[0], None, (), selector.evaluate
        if isinstance(c, IsNull) and c.negated:
            return None, c.name, None, (), selector.evaluate
    if isinstance(cond, Const) and cond.value is True:
        return None, None, None, (), None
    return None, None, None, (), selector.evaluate


class SubscriptionIndex(Generic[K]):
    """Compiled selectors filed by key (e.g. `(subscriber, subscription_id)`) for fast matching.

    Not thread-safe for concurrent `add`/`remove` and `match`; one index per topic, owned by
    the topic's task, is the intended use.
    """

    def __init__(self) -> None:
        self._by_key: dict[K, _Group] = {}
        self._groups: dict[Cond, _Group] = {}
        self._tables: dict[_Table, dict[str, dict[str | float, _Bucket]]] = {
            t: {} for t in _Table
        }
        #: unkeyed groups with a threshold, by the threshold's identifier
        self._ranges: dict[str, _Bucket] = {}
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
        slots: list[tuple[dict[Any, _Bucket], Any]] = []
        if group.keys is not None:
            by_value = self._tables[group.keys.table].setdefault(group.keys.name, {})
            slots = [(by_value, value) for value in group.keys.keys]
        elif group.threshold is not None:
            slots = [(self._ranges, group.threshold[0])]
        elif group.presence is not None:
            groups = self._presence.setdefault(group.presence, set())
            if add:
                groups.add(group)
            else:
                groups.discard(group)
                if not groups:
                    del self._presence[group.presence]
        elif add:
            self._fallback.add(group)
        else:
            self._fallback.discard(group)
        for table, slot in slots:
            if add:
                table.setdefault(slot, _Bucket()).add(group)
            else:
                table[slot].remove(group)
                if not table[slot]:
                    del table[slot]
        if group.keys is not None and not add:
            tables = self._tables[group.keys.table]
            if not tables[group.keys.name]:
                del tables[group.keys.name]

    def match(self, fields: _Fields) -> set[K]:
        """Every key whose selector matches a message's stored fields."""
        matched: set[K] = set()
        candidates: set[_Group] = set()  # to evaluate: their residual decides
        passed: set[_Group] = set()  # past their threshold: checks, then residual, decide
        stats: _Stats = {}
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
                    if bucket is not None:
                        bucket.scan(fields, stats, candidates, passed)
        for _, bucket in self._iter_present(self._ranges, fields):
            bucket.scan(fields, stats, candidates, passed)
        for _, groups in self._iter_present(self._presence, fields):
            candidates.update(groups)
        candidates.update(self._fallback)
        for group in candidates:
            residual = group.residual
            if residual is None or residual(fields) is True:
                matched.update(group.subscribers)
        for group in passed:
            for name, side, test, limit in group.checks:
                bounds = stats[name] if name in stats else _stats(fields, name, stats)
                if bounds is None or not test(bounds[side], limit):
                    break
            else:
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
