"""Silence (runtime.heartbeat): how long a peer has been silent, the observer's own stalls not
counted. Pure: the tests pass the time."""
from __future__ import annotations

import pytest

from runtime.heartbeat import Silence


def test_a_peer_is_lost_after_the_timeout_of_silence_and_not_before():
    s = Silence(timeout_s=3.0, tick_s=0.5)
    s.tick(0.0)
    s.heard("a")
    lost_at = None
    for i in range(1, 20):
        if s.tick(i * 0.5) and lost_at is None:
            lost_at = i * 0.5
    assert lost_at == 3.5  # the first tick past 3 s of silence


def test_a_heartbeat_resets_the_silence():
    s = Silence(timeout_s=3.0, tick_s=0.5)
    s.heard("a")
    for i in range(1, 40):
        if i % 4 == 0:
            s.heard("a")  # every 2 s, under the timeout
        assert s.tick(i * 0.5) == []


def test_a_stall_of_the_observer_is_not_the_peers_silence():
    s = Silence(timeout_s=3.0, tick_s=0.5)
    s.tick(0.0)
    s.heard("a")
    # The observer's loop was blocked for 10 s: the next tick comes that late. Only two ticks'
    # worth counts; the heartbeats of that time are waiting unread in its socket.
    assert s.tick(10.0) == []
    assert s.silent_for("a") == pytest.approx(1.0)
    assert s.stalled_s == pytest.approx(9.0)
    s.heard("a")  # the queued heartbeats are read
    assert s.silent_for("a") == 0.0


def test_a_peer_that_stays_silent_is_lost_even_while_the_observer_is_slow():
    """Late ticks slow detection down (each adds at most 2 ticks) but never stop it."""
    s = Silence(timeout_s=3.0, tick_s=0.5)
    s.tick(0.0)
    s.heard("a")
    lost, t = [], 0.0
    while not lost:
        t += 5.0  # every tick 5 s late
        lost = s.tick(t)
    assert lost == ["a"] and t == 20.0  # 1 s of silence counted per late tick: > 3 s at the 4th


def test_forgotten_peers_are_not_reported_and_bad_settings_are_refused():
    s = Silence(timeout_s=1.0, tick_s=0.5)
    s.tick(0.0)
    s.heard("a")
    s.heard("b")
    s.forget("a")
    assert s.tick(1.0) == [] and s.tick(1.5) == ["b"]
    with pytest.raises(ValueError, match="below the timeout"):
        Silence(timeout_s=1.0, tick_s=1.0)
