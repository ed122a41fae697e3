"""signer.admission.webhook: the admission webhook's HTTP server as an unauthenticated caller meets
it. Malformed bodies get a typed error and one log line, never a traceback; a body too big or too
slow is cut off; a forged review is answered with its own UID and no fact; and the NetworkPolicy
in front of the port. The verdicts themselves are `test_signer_review`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from signer.admission import review, webhook
from signer.admission.webhook import PATH, WebhookServer
from tests.admission_reviews import (
    MALFORMED,
    NODE_UID,
    NOW,
    POD_UID,
    POLICY,
    SA_UID,
    SIGNER,
    admission_review,
    encode,
    facts,
    forged,
    live,
    no_facts,
)


def server(facts_now: Any = facts) -> WebhookServer:
    return WebhookServer("127.0.0.1", 0, None, [SIGNER], facts_now, POLICY, lambda: NOW)  # type: ignore[arg-type]


def post(hook: WebhookServer, body: bytes, *, chunked: bool = False) -> tuple[int, Any]:
    async def run() -> tuple[int, Any]:
        app = web.Application(client_max_size=review.MAX_BODY_BYTES)
        app.router.add_post(PATH, hook.handle)
        async with TestClient(TestServer(app)) as client:
            data: Any = body
            if chunked:

                async def stream() -> Any:
                    for i in range(0, len(body), 65536):
                        yield body[i : i + 65536]

                data = stream()
            resp = await client.post(PATH, data=data)
            return resp.status, await resp.json()

    return asyncio.run(run())


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    assert [r for r in caplog.records if r.exc_info] == []
    assert "Traceback" not in caplog.text
    assert "RecursionError" not in caplog.text


@pytest.mark.parametrize(("body", "status", "reason"), MALFORMED)
def test_the_server_answers_malformed_input_with_a_typed_error_and_one_line(
    caplog: pytest.LogCaptureFixture, body: bytes, status: int, reason: str
) -> None:
    caplog.set_level(logging.INFO)
    code, answer = post(server(no_facts), body)
    assert (code, answer["reason"]) == (status, reason)
    assert set(answer) == {"reason", "message"} and len(answer["message"]) < 100
    no_tracebacks(caplog)
    lines = [r for r in caplog.records if r.name == "podcert.signer.webhook"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert len(lines[0].getMessage()) < 200


def test_a_chunked_body_over_the_limit_is_refused_without_reading_it_all(
    caplog: pytest.LogCaptureFixture,
) -> None:
    code, answer = post(server(no_facts), b" " * (3 * 1024 * 1024), chunked=True)
    assert (code, answer["reason"]) == (413, "TooLarge")
    no_tracebacks(caplog)


def test_a_body_that_stalls_is_refused_at_the_deadline(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(webhook, "_READ_TIMEOUT", 0.05)

    async def run() -> tuple[int, Any]:
        app = web.Application()
        app.router.add_post(PATH, server(no_facts).handle)
        never = asyncio.Event()

        async def stall() -> Any:
            yield b'{"apiVersion": '
            await never.wait()

        async with TestClient(TestServer(app)) as client:
            resp = await client.post(PATH, data=stall())
            return resp.status, await resp.json()

    assert asyncio.run(run()) == (
        408,
        {"reason": "TooSlow", "message": "the body did not arrive in time"},
    )
    no_tracebacks(caplog)


def test_the_server_answers_a_forged_review_with_the_uid_and_no_facts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    code, answer = post(
        server(live(pod=None)), encode(admission_review(object=forged(namespace="bank")))
    )
    reference_code, reference = post(
        server(live()), encode(admission_review(object=forged(namespace="bank")))
    )
    assert code == reference_code == 200
    assert answer == reference, "a missing pod and a UID mismatch read the same"
    response = answer["response"]
    assert response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    assert response["allowed"] is False
    assert set(response) == {"uid", "allowed", "status"}
    for uid in (POD_UID, NODE_UID, SA_UID):
        assert uid not in json.dumps(answer)
    no_tracebacks(caplog)


def test_the_server_admits_the_pods_own_node() -> None:
    code, answer = post(server(), encode(admission_review()))
    assert code == 200 and answer["response"]["allowed"] is True


# --- the NetworkPolicy in front of the port -------------------------------------------------------

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests" / "signer"


def test_only_the_api_server_may_reach_the_webhook_port_and_only_monitoring_the_metrics() -> None:
    listed = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    assert "networkpolicy.yaml" in listed
    policy = yaml.safe_load((MANIFESTS / "networkpolicy.yaml").read_text())
    deployment = yaml.safe_load((MANIFESTS / "deployment.yaml").read_text())
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in deployment["spec"]["template"]["spec"]["containers"][0]["ports"]}
    by_port = {rule["ports"][0]["port"]: rule for rule in spec["ingress"]}
    assert set(by_port) == ports == {"webhook", "metrics"}
    [source] = by_port["webhook"]["from"]
    assert set(source) == {"ipBlock"}, "the webhook port: from the API server's addresses only"
    # The metrics port was open to every pod. Probes come from the pod's own
    # node, which NetworkPolicy never filters.
    assert by_port["metrics"]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ], "metrics: from the monitoring namespace only"
