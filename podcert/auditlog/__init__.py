"""The signer's audit log format: the line format, the audit certificate, `verify`, `iter_entries`.

Why it lives in podcert's bottom layer: the log is written by the signer
(`signer.auditlog.writer.AuditLog`) but read by auditors, `podcert audit` among them, which must not
depend on the signer. So the format (how a line is framed, encoded and hashed, what an audit
certificate is) and everything that reads it live here, and both the writer and the audit import
them: one definition for both sides.

Each line carries the SHA-256 of the line before it, so removing or editing a line breaks the
chain at that point. A chain alone can be recomputed by someone who rewrites the whole file, so
the log also holds checkpoints: JWTs (ES256) signed by a dedicated audit key, attesting the chain
head, the line count and the checkpoint's own number, with the audit key's certificate chain in the
`x5c` header. A rewrite then has to forge a signature that chains to the trust roots *and* comes
from an audit certificate: one whose only extended key usage is `AUDIT_SIGNING_EKU` and whose only
name is a SPIFFE ID with the path `AUDIT_SPIFFE_PATH`. The signer issues workloads clientAuth +
serverAuth leaves named `/ns/<ns>/sa/<sa>`, so no workload key, whatever it is trusted for, can sign
a checkpoint that verifies.

Reading is pure and takes `now`, so auditors and tests run it over any sequence of lines. An
`Entry` has no field that could hold key material, and a verifier rejects lines with fields it
does not know.

Line format (one JSON object per line, compact, ASCII, keys in this order):

    {"seq":1,"prev":"<64 hex>","kind":"entry","time":"2026-05-01T12:00:00Z",...}
    {"seq":2,"prev":"<64 hex>","kind":"checkpoint","jwt":"<header>.<claims>.<signature>"}

`seq` is the 1-based line number, `prev` the hex SHA-256 of the previous line's exact bytes without
its newline (64 zeros on line 1). Checkpoint claims: `head` (hash of the line before it), `lines`
(how many lines precede it), `n` (the checkpoint's number: 1, 2, 3... in the file, never reused;
the signer exports the newest as a metric, so a log cut back to an earlier checkpoint shows) and
`iat` (seconds since the epoch), and `format`.

Format versions (`podcert.persisted`): `FORMAT` is what this release writes and the newest it
reads. Format 1 is 0.1.0's log: its lines carry no `format` field and 0.1.0's checkpoints no
`format` claim; this release writes the same lines, and checkpoints with `"format": 1` (a claim
0.1.0 ignores, so 0.1.0 still reads and continues the log). From format 2 on every line carries
`"format": N` after `kind`, so a reader meets a newer line as `NewerFormatLine`, not as damage:
`verify` stops there naming the line and the format, and the writer refuses to open the file.
"""

from podcert.auditlog.checkpoints import (
    AUDIT_SIGNING_EKU,
    AUDIT_SPIFFE_PATH,
    Verification,
    audit_certificate_problem,
    verify,
)
from podcert.auditlog.lines import (
    CHECKPOINT_ALGORITHM,
    FORMAT,
    GENESIS,
    AuditLogError,
    Decision,
    Entry,
    Line,
    NewerFormatLine,
    encode_line,
    entry_fields,
    iter_entries,
    line_hash,
    parse_line,
)

__all__ = [
    "AUDIT_SIGNING_EKU",
    "AUDIT_SPIFFE_PATH",
    "CHECKPOINT_ALGORITHM",
    "FORMAT",
    "GENESIS",
    "AuditLogError",
    "audit_certificate_problem",
    "Decision",
    "Entry",
    "Line",
    "NewerFormatLine",
    "Verification",
    "encode_line",
    "entry_fields",
    "iter_entries",
    "line_hash",
    "parse_line",
    "verify",
]
