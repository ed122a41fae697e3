"""The client's token-refresh hook runs at most once per period, for as long as the client lives.

The kubernetes client calls the hook before every request, and its loaders re-install a fresh
hook each time theirs runs: a plain wrapper would be thrown away by the first refresh (this
was a real regression: every request rebuilt the configuration again)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from podcert.rest import TOKEN_REFRESH_PERIOD, ThrottledRefresh, load_client


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Configuration:
    """Shaped like kubernetes' own: its hook replaces itself on every run."""

    def __init__(self) -> None:
        self.runs = 0
        self.refresh_api_key_hook: Any = self.make_hook()

    def make_hook(self) -> Any:
        def hook(configuration: Configuration) -> None:
            configuration.runs += 1
            configuration.refresh_api_key_hook = self.make_hook()

        return hook


def test_the_hook_runs_once_per_period_even_though_it_replaces_itself() -> None:
    clock = FakeClock()
    configuration = Configuration()
    throttled = ThrottledRefresh(configuration.refresh_api_key_hook, 30.0, clock)
    configuration.refresh_api_key_hook = throttled

    for _ in range(5):
        configuration.refresh_api_key_hook(configuration)
    assert configuration.runs == 1
    assert configuration.refresh_api_key_hook is throttled

    clock.now += 29.9
    configuration.refresh_api_key_hook(configuration)
    assert configuration.runs == 1

    clock.now += 0.1
    for _ in range(3):
        configuration.refresh_api_key_hook(configuration)
    assert configuration.runs == 2
    assert configuration.refresh_api_key_hook is throttled


def test_a_token_kubeconfig_keeps_the_throttle_through_real_requests(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    configuration = load_client(kubeconfig).configuration
    throttled = configuration.refresh_api_key_hook
    assert isinstance(throttled, ThrottledRefresh)
    assert throttled.period == TOKEN_REFRESH_PERIOD

    # What the client does before each request: the first call refreshes, later ones do not,
    # and the throttle is still the hook afterwards.
    for _ in range(3):
        assert configuration.get_api_key_with_prefix("BearerToken") == "Bearer not-a-real-token"
    assert configuration.refresh_api_key_hook is throttled
    assert throttled.hook is not None and not isinstance(throttled.hook, ThrottledRefresh)
