"""How a PodCertificateRequest's outcome is read, once for the signer, the shim and the audit.

Pure and tolerant: a status of the wrong shape reads as "not settled", never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal, cast

Outcome = Literal["Issued", "Denied", "Failed"]
OUTCOMES: Final[frozenset[str]] = frozenset({"Issued", "Denied", "Failed"})


def terminal_condition(status: object) -> tuple[Outcome, str, str] | None:
    """(type, reason, message) of the status's Issued/Denied/Failed condition, if any."""
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conditions if isinstance(conditions, list) else ():
        if not isinstance(cond, Mapping) or cond.get("status") != "True":
            continue
        kind = cond.get("type")
        if kind in OUTCOMES:
            reason, message = cond.get("reason") or "", cond.get("message") or ""
            return cast(Outcome, kind), str(reason), str(message)
    return None


def outcome(pcr: Mapping[str, Any]) -> Outcome | None:
    """ "Issued", "Denied" or "Failed" when the request is settled, else None. A chain without
    a condition counts as Issued: the chain is immutable once written."""
    status = pcr.get("status")
    condition = terminal_condition(status)
    if condition is not None:
        return condition[0]
    if isinstance(status, Mapping) and status.get("certificateChain"):
        return "Issued"
    return None
