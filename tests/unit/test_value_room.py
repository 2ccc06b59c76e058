"""The room a recipe's record leaves for a user's value is the same at every call.

It once depended on the digits of the registration time as read at that moment (1.5 and
1.125 are not as long): the largest value a join accepted was refused by the next join of
the same value a moment later.
"""

from __future__ import annotations

import pytest

import coord


@pytest.mark.parametrize("now", [1795862031.1, 1795862031.125, 1795862031.0, 1.0])
def test_the_room_for_a_value_does_not_follow_the_clock(
    now: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = coord.connect("memory://", identity="room")
    group, election = client.group("g"), client.election("e")
    rooms = (group.max_value_size, election.max_value_size)
    monkeypatch.setattr("time.time", lambda: now)
    assert (group.max_value_size, election.max_value_size) == rooms
    group.join(b"v" * rooms[0])  # accepted at any time
    election.campaign(b"v" * rooms[1])
    with pytest.raises(coord.ConfigurationError):
        group.join(b"v" * (rooms[0] + 3))
