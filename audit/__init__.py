"""`podcert audit`: the rotation audit across the cluster, a node's projected files and the
signer's audit logs.

The public face: build a `Snapshot` (or read one with `audit.snapshot`), call `audit_findings`,
read the `Report`. The steps live in their own modules: examine (one node volume), join (inputs
per projection), assess (one projection), trust (anchors), logs (the audit logs), report (the
table) and cli.
"""

from audit.examine import VolumeFacts, examine_volume
from audit.findings import audit_findings, chain_roots
from audit.model import (
    AuditLogReport,
    Finding,
    FindingKind,
    Projection,
    Report,
    Root,
    Settings,
    Snapshot,
    State,
    TrustSource,
    VolumeFiles,
)

__all__ = [
    "AuditLogReport",
    "Finding",
    "FindingKind",
    "Projection",
    "Report",
    "Root",
    "Settings",
    "Snapshot",
    "State",
    "TrustSource",
    "VolumeFacts",
    "VolumeFiles",
    "audit_findings",
    "chain_roots",
    "examine_volume",
]
