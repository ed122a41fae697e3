"""signer.admission.cainjector: the edge that keeps the caBundle of the signer's own
ValidatingWebhookConfiguration equal to its roots. One write when it differs and none when it
holds them; a configuration that is not there (yet, or any more) is waited for, never created; a
write that meets a change looks again once the watch has brought it; and only the leader, once its
watch has listed, writes. What the bundle must be is `test_signer_cabundle`'s; here the API is a
stand-in that records the writes."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from typing import Any, cast

import pytest
from cryptography import x509

from podcert.client.rest import ApiError
from signer.admission.cainjector import CAInjector
from signer.authority import ca
from signer.kube import SignerKube
from tests.unit.test_signer_cabundle import held, shipped

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NAME = "podcert-signer"


class Kube:
    """The one write the injector makes; `refuse` is the status the next write fails with."""

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.refuse: int | None = None

    def replace_webhook_configuration(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.refuse is not None:
            status, self.refuse = self.refuse, None
            raise ApiError(status, "Refused", "refused")
        self.written.append(body)
        version = int(body["metadata"]["resourceVersion"]) + 1
        return {**body, "metadata": {**body["metadata"], "resourceVersion": str(version)}}


class Signer:
    """What the injector asks of the signer: its roots, and whether it leads."""

    def __init__(self, *roots: x509.Certificate) -> None:
        self.roots = list(roots)
        self.leading = True


@pytest.fixture(scope="module")
def roots() -> list[x509.Certificate]:
    return [ca.new_ca(name, T0).root for name in ("a", "b")]


def injector(kube: Kube, signer: Signer) -> CAInjector:
    return CAInjector(
        cast(SignerKube, kube),
        NAME,
        lambda: signer.roots,
        lambda: signer.leading,
        threading.Event(),
    )


def test_a_configuration_without_the_roots_gets_one_write_and_then_none(
    roots: list[x509.Certificate],
) -> None:
    kube = Kube()
    hook = injector(kube, Signer(roots[0]))
    hook._on_list([shipped()])

    assert hook.reconcile()
    assert not hook.reconcile()  # what it wrote holds the roots

    (written,) = kube.written
    assert held(written) == [roots[0]]
    assert written["metadata"]["resourceVersion"] == "41"  # the version read: a change is a 409


def test_new_roots_are_written_on_the_next_look(roots: list[x509.Certificate]) -> None:
    kube, signer = Kube(), Signer(roots[0])
    hook = injector(kube, signer)
    hook._on_list([shipped()])
    hook.reconcile()

    signer.roots = list(roots)  # a CA prepared: both roots must be trusted
    assert hook.reconcile()

    assert [held(w) for w in kube.written] == [[roots[0]], roots]


def test_a_configuration_not_there_yet_is_waited_for_said_once_and_never_created(
    roots: list[x509.Certificate], caplog: pytest.LogCaptureFixture
) -> None:
    kube = Kube()
    hook = injector(kube, Signer(*roots))
    hook._on_list([])

    with caplog.at_level(logging.WARNING, logger="podcert.signer.webhook"):
        assert not hook.reconcile()
        assert not hook.reconcile()
    assert kube.written == []
    assert len(caplog.records) == 1 and "does not exist (yet)" in caplog.records[0].getMessage()

    hook._on_event("ADDED", shipped())  # the operator applied it
    assert hook.reconcile()
    hook._on_event("DELETED", kube.written[-1])
    assert not hook.reconcile()
    assert len(kube.written) == 1


def test_a_write_that_meets_a_change_waits_for_the_watch_and_looks_again(
    roots: list[x509.Certificate],
) -> None:
    kube = Kube()
    hook = injector(kube, Signer(*roots))
    hook._on_list([shipped()])
    hook.reflector.synced.set()
    pool = hook.pool()
    key = hook.queue.get(timeout=0)
    assert key == NAME

    kube.refuse = 409
    pool.process(key)

    assert kube.written == []
    assert hook.queue.failures(NAME) == 0  # not an error: changed meanwhile
    assert len(hook.queue) == 1  # looked at again shortly


def test_a_refusal_other_than_a_change_is_an_error_to_retry(roots: list[x509.Certificate]) -> None:
    kube = Kube()
    hook = injector(kube, Signer(*roots))
    hook._on_list([shipped()])

    kube.refuse = 403
    with pytest.raises(ApiError) as caught:
        hook.reconcile()

    assert caught.value.status == 403


@pytest.mark.parametrize(
    ("leading", "synced", "writes"),
    [
        pytest.param(True, True, 1, id="the leader whose watch listed writes"),
        pytest.param(False, True, 0, id="a replica that does not lead never writes"),
        pytest.param(True, False, 0, id="before its watch listed, the leader does not write"),
    ],
)
def test_only_the_leader_writes_once_its_watch_has_listed(
    roots: list[x509.Certificate], leading: bool, synced: bool, writes: int
) -> None:
    kube, signer = Kube(), Signer(*roots)
    signer.leading = leading
    hook = injector(kube, signer)
    hook._on_list([shipped()])
    if synced:
        hook.reflector.synced.set()

    hook.pool().process(NAME)

    assert len(kube.written) == writes
