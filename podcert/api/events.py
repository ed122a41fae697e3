"""core/v1 Event bodies, as the kubelet and controllers record them: what `kubectl describe`
shows under the object. The signer records them on requests, the shim on pods. Pure: the caller
picks the name's suffix and the time and POSTs the body."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final, Literal

from podcert.api.times import format_time

EventType = Literal["Normal", "Warning"]
# Longer messages are cut: Events are for people, and the API server caps them anyway.
MAX_MESSAGE: Final = 1024


@dataclass(frozen=True)
class ObjectRef:
    """The object an Event is about (its involvedObject)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    resource_version: str | None = None


def event_body(
    about: ObjectRef,
    *,
    event_type: EventType | str,
    reason: str,
    message: str,
    now: dt.datetime,
    component: str,
    suffix: str,
    instance: str | None = None,
) -> dict[str, Any]:
    """An Event named `<object name>.<suffix>` in the object's namespace, reported by
    `component` (on `instance`, e.g. a node name, when given)."""
    involved: dict[str, Any] = {
        "apiVersion": about.api_version,
        "kind": about.kind,
        "name": about.name,
        "namespace": about.namespace,
        "uid": about.uid,
    }
    if about.resource_version is not None:
        involved["resourceVersion"] = about.resource_version
    source = {"component": component}
    if instance is not None:
        source["host"] = instance
    stamp = format_time(now)
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{about.name}.{suffix}", "namespace": about.namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": event_type,
        "source": source,
        "reportingComponent": component,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
    if instance is not None:
        body["reportingInstance"] = instance
    return body
