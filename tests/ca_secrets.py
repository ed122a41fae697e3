"""The CA Secret held in memory, for the unit tests of what reads and writes it (`CAStore`, the
process wiring, the formats kept across releases): the three calls `CAStore` makes of the API,
with the Secret's resourceVersion checked on every replace and the writes counted, and the watch
event that brings a Secret's new version."""

from __future__ import annotations

import base64
from collections.abc import Mapping


class SecretKube:
    """The three calls CAStore makes of the API, on one Secret in memory; counts the writes."""

    def __init__(self, data: Mapping[str, bytes] | None) -> None:
        self.data = dict(data) if data is not None else None
        self.version = 1
        self.writes = 0

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        return None if self.data is None else (dict(self.data), str(self.version))

    def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> bool:
        self.writes += 1
        self.data = dict(data)
        return True

    def replace_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes],
        resource_version: str,
        labels: Mapping[str, str],
    ) -> str:
        assert resource_version == str(self.version)
        self.writes += 1
        self.data, self.version = dict(data), self.version + 1
        return str(self.version)


def secret_event(data: Mapping[str, bytes], version: str) -> dict[str, object]:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {"metadata": {"resourceVersion": version}, "data": encoded}
