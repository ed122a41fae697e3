"""signer.model: Denied, Failed and Retry reasons, and the retry metric's labels, are closed types:
a reason mistyped anywhere fails mypy, and a decision kind the settlement forgets fails it too.
Shown by running mypy (the project's own configuration, strict) on a snippet whose marked lines must
be exactly the ones it rejects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest
from mypy import api

from signer import model
from signer.admission import review
from signer.issue import decide

ROOT = Path(__file__).resolve().parents[2]

SNIPPET = """
import datetime as dt
from typing import assert_never

from signer import model

from signer.admission import review
from signer.metrics import Metrics
from signer.issue.settle import EventNote, Labels

model.Deny("PodNotFound", "spelled right")
model.Deny("PodNotFund", "a typo")  # rejected
model.Fail("SignerMisconfigured", "spelled right")
model.Fail("SignerMisconfigred", "a typo")  # rejected
model.Retry(dt.timedelta(seconds=5), "CANotLoaded")
model.Retry(dt.timedelta(seconds=5), "CANotLoded")  # rejected
model.Deny("CANotLoaded", "a retry reason is no denial")  # rejected
Labels("example.com/x", "Denied", "PolicyDenied")
Labels("example.com/x", "Denied", "PolicyDenid")  # rejected
Labels("example.com/x", "Denid", "PolicyDenied")  # rejected
EventNote("Warning", "UnknownAnnotaton", "a typo")  # rejected
review.Verdict(False, "no", "PodBindingMismatch")
review.Verdict(False, "no", "PodBindingMismach")  # rejected
Metrics().count_retry("AuditLogUnwritable")
Metrics().count_retry("CANotLoaded")
Metrics().count_retry("API503")
Metrics().count_retry("AuditLogUnwriteable")  # rejected
Metrics().count_retry("API5O3")  # rejected
Metrics().count_retry("PodNotFound")  # rejected: a denial is no retry


def check(decision: model.Deny) -> bool:
    return decision.reason == "PodNotFund"  # rejected


def outcome(answer: model.Answer) -> str:
    if isinstance(answer, model.Signed):
        return "Issued"
    elif isinstance(answer, model.Deny):
        return "Denied"
    else:
        assert_never(answer)  # rejected: Fail is not handled
"""


def test_a_mistyped_reason_or_a_forgotten_decision_kind_fails_the_type_check(
    tmp_path: Path,
) -> None:
    snippet = tmp_path / "reasons_snippet.py"
    snippet.write_text(SNIPPET)
    expected = {
        number for number, line in enumerate(SNIPPET.splitlines(), 1) if "# rejected" in line
    }
    stdout, stderr, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "mypy-cache"),
            "--no-error-summary",
            str(snippet),
        ]
    )
    assert status == 1, stdout + stderr
    rejected = {
        int(found) for found in re.findall(rf"{re.escape(snippet.name)}:(\d+): error", stdout)
    }
    assert rejected == expected, stdout


@pytest.mark.parametrize(
    ("constants", "reason_type"),
    [
        pytest.param(
            [v for k, v in vars(model).items() if k.isupper() and isinstance(v, str)],
            model.DenyReason | model.FailReason,
            id="every named reason in model is a Denied or Failed reason",
        ),
        pytest.param(
            [decide.CA_NOT_LOADED, decide.CA_NOT_YET_VALID, decide.CA_TOO_SHORT],
            model.RetryReason,
            id="every named retry reason is a RetryReason",
        ),
        pytest.param(
            [review.BINDING_MISMATCH, review.CREATOR_NOT_NODE],
            review.VerdictReason,
            id="the webhook's own reasons are verdict reasons",
        ),
    ],
)
def test_named_reasons_belong_to_their_type(constants: list[str], reason_type: object) -> None:
    allowed = {value for part in get_args(reason_type) for value in get_args(part) or (part,)}
    assert constants
    assert set(constants) <= allowed


def test_the_binding_reasons_are_the_denied_reasons_of_the_node_restriction_checks() -> None:
    assert {
        model.POD_NOT_FOUND,
        model.POD_UID_MISMATCH,
        model.POD_NOT_ON_NODE,
        model.POD_NOT_RUNNABLE,
        model.NODE_NOT_FOUND,
        model.NODE_UID_MISMATCH,
        model.SERVICE_ACCOUNT_MISMATCH,
    } == model.BINDING_REASONS
    assert set(get_args(model.DenyReason)) > model.BINDING_REASONS
