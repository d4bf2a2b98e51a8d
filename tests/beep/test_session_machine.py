"""Every (state, input) pair of the session machine: the table's move or a clean refusal."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.beep import LocalProtocolError
from adapters.beep._session import TRANSITIONS, SessionInput, SessionMachine, SessionState


@given(state=st.sampled_from(SessionState), input_=st.sampled_from(SessionInput))
def test_every_pair_moves_by_the_table_or_refuses(state: SessionState, input_: SessionInput
                                                  ) -> None:
    """A pair in the table moves to its target; any other raises and leaves the state alone."""
    machine = SessionMachine()
    machine.state = state
    expected = TRANSITIONS.get((state, input_))
    if expected is None:
        with pytest.raises(LocalProtocolError):
            machine.process(input_)
        assert machine.state is state
    else:
        assert machine.process(input_) is expected


@pytest.mark.parametrize("state", [SessionState.CLOSED, SessionState.TERMINATED])
def test_terminal_states_accept_only_transport_close(state: SessionState) -> None:
    """Nothing but the transport closing is legal once the session is over."""
    legal = {i for (s, i) in TRANSITIONS if s is state}
    assert legal == {SessionInput.TRANSPORT_CLOSED}


def test_data_needs_both_greetings() -> None:
    """We may send data only after both greetings (RFC 3080 §2.3.1.1)."""
    senders = {s for (s, i) in TRANSITIONS if i is SessionInput.SEND_DATA}
    assert senders == {SessionState.OPEN, SessionState.CLOSING}


@given(st.lists(st.sampled_from(SessionInput), max_size=20))
def test_random_walks_stay_in_known_states(inputs: list[SessionInput]) -> None:
    """Any sequence of inputs leaves the machine in a SessionState, refusing illegal steps."""
    machine = SessionMachine()
    for input_ in inputs:
        with contextlib.suppress(LocalProtocolError):
            machine.process(input_)
        assert machine.state in SessionState
