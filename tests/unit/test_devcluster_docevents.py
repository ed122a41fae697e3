"""The reasons and Events reference lists every closed reason with the code's comment on it,
every Event the signer and the shim record, and refuses a call site it cannot read."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from devcluster import docevents
from signer import model


def test_every_closed_reason_and_every_shim_event_is_listed() -> None:
    page = docevents.reasons_markdown()
    for literal in (model.DenyReason, model.FailReason, model.RetryReason):
        for reason in docevents._flat(literal):
            assert f"| `{reason}` |" in page
    assert len(docevents._flat(model.DenyReason)) == len(get_args(model.BindingReason)) + 8
    events = docevents.shim_event_reasons()
    assert {"CertificateDenied", "CertificateExpired", "InvalidProjectedVolume"} <= set(events)
    assert {f"| `{r}` | Warning | shim |" for r in events} <= set(page.splitlines())


def test_a_shim_event_whose_reason_cannot_be_read_fails_the_generator(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("self.event(pod, 'Warning', make_reason(), 'm', now)\n")
    with pytest.raises(ValueError, match=r"x\.py:1"):
        docevents.shim_event_reasons(tmp_path)


def test_the_signers_own_events_are_listed_with_what_they_are_on() -> None:
    events = docevents.signer_event_reasons()
    assert events["UpstreamCASuccessorDue"][0] == "the CA Secret"
    assert "`UpstreamCASuccessorDue` | Warning | the CA Secret" in docevents.reasons_markdown()


def test_a_signer_event_whose_reason_is_no_modules_constant_fails_the_generator(
    tmp_path: Path,
) -> None:
    (tmp_path / "x.py").write_text("kube.record_secret_event(ns, name, 'Made', 'm', now)\n")
    with pytest.raises(ValueError, match="not a module's REASON"):
        docevents.signer_event_reasons(tmp_path)
