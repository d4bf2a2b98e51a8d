"""Every (state, input) pair of the TLS and authentication machines."""

from __future__ import annotations

import contextlib
from enum import Enum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.beep import LocalProtocolError
from adapters.beep._tuning_state import (
    AUTH_TRANSITIONS,
    TLS_TRANSITIONS,
    AuthInput,
    AuthState,
    Machine,
    TlsInput,
    TlsState,
)

MACHINES: list[tuple[dict[tuple[Enum, Enum], Enum], type[Enum], type[Enum]]] = [
    (TLS_TRANSITIONS, TlsState, TlsInput),  # type: ignore[list-item]
    (AUTH_TRANSITIONS, AuthState, AuthInput),  # type: ignore[list-item]
]


@pytest.mark.parametrize(("table", "states", "inputs"), MACHINES, ids=["tls", "auth"])
@settings(max_examples=60)
@given(data=st.data())
def test_every_pair_moves_by_the_table_or_refuses(
        table: dict[tuple[Enum, Enum], Enum], states: type[Enum], inputs: type[Enum],
        data: st.DataObject) -> None:
    """A pair in the table moves to its target; any other raises and leaves the state alone."""
    state = data.draw(st.sampled_from(list(states)))
    input_ = data.draw(st.sampled_from(list(inputs)))
    machine: Machine[Enum, Enum] = Machine(table, state)
    expected = table.get((state, input_))
    if expected is None:
        with pytest.raises(LocalProtocolError):
            machine.process(input_)
        assert machine.state is state
    else:
        assert machine.process(input_) is expected


def test_secured_and_authenticated_are_final() -> None:
    """Once secured, TLS never moves again; once authenticated, neither does authentication."""
    assert not [i for (s, i) in TLS_TRANSITIONS if s is TlsState.SECURED]
    assert not [i for (s, i) in AUTH_TRANSITIONS if s is AuthState.AUTHENTICATED]


def test_tls_reaches_secured_only_through_a_reset() -> None:
    """SECURED is entered only from NEGOTIATING, which only a reset (closed channels) enters."""
    assert {s for (s, _), t in TLS_TRANSITIONS.items() if t is TlsState.SECURED} \
        == {TlsState.NEGOTIATING}
    assert {i for (_, i), t in TLS_TRANSITIONS.items() if t is TlsState.NEGOTIATING} \
        == {TlsInput.RESET}


@given(st.lists(st.sampled_from(TlsInput), max_size=20))
def test_random_walks_stay_in_known_states(inputs: list[TlsInput]) -> None:
    """Any sequence of inputs leaves the TLS machine in a TlsState, refusing illegal steps."""
    machine = Machine(TLS_TRANSITIONS, TlsState.PLAIN)
    for input_ in inputs:
        with contextlib.suppress(LocalProtocolError):
            machine.process(input_)
        assert machine.state in TlsState
