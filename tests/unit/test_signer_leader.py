"""Lease decisions use our own observation time, never the holder's clock."""

from __future__ import annotations

import pytest

from signer.leader import LeaseSettings, decide_lease

S = LeaseSettings(duration=15, renew_deadline=10, retry_period=2)


@pytest.mark.parametrize(
    ("holder", "seen", "now", "action"),
    [
        pytest.param(None, None, 100.0, "acquire", id="no lease: take it"),
        pytest.param("", 90.0, 100.0, "acquire", id="released lease: take it"),
        pytest.param("me", 90.0, 100.0, "renew", id="ours: renew"),
        pytest.param("other", 90.0, 100.0, "wait", id="held and renewed 10s ago: wait"),
        pytest.param("other", 85.0, 100.0, "acquire", id="not renewed for 15s: take over"),
        pytest.param("other", None, 100.0, "acquire", id="never seen changing: take over"),
    ],
)
def test_decide_lease(holder: str | None, seen: float | None, now: float, action: str) -> None:
    assert decide_lease(holder, "me", seen, now, S) == action
