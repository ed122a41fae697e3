"""Hostile input through every workload- and node-side parser a stranger can feed: only typed
errors ever come out. (What anyone who creates requests feeds the signer, the key parser, the
request off the wire, decide, the annotation parser and the policy loader, is
`test_signer_hostile_input.py`'s; both draw on `tests.hostile_seeds`.)

One property-based target per parser that reads bytes or objects someone else controls, each with
the exception types it may raise (anything else is a bug):

    target                                          fed by                      may raise
    bundles.formats.load_credential(_files),        files in a pod volume       BundleError,
      load_trust_bundle, then spiffe_id and                                     CertificateIdError
      verify_chain on what loaded
    podcert.auditlog.verify                         an audit log on disk        nothing
    podcert.auditlog.iter_entries                   same                        AuditLogError
    podcert.api.pods.parse_pod                      pod specs                   nothing

The strategies start from valid inputs and damage them where the parsers look, so most examples
get past the first check: DER trees re-encoded with correct lengths around one damaged element
(dropped, duplicated, retagged, emptied, grafted from another structure, nested hundreds deep),
raw length fields set to huge or indefinite values, PEM blocks duplicated, dropped, relabelled and
re-armoured, audit lines edited, re-chained, or forged as checkpoints signed by a rogue key with
hostile claims, and JSON objects with fields deleted, retyped, renamed or blown up past the API's
size limits. Random bytes are only one strategy among many.

Example counts come from the `podcert-fuzz` hypothesis profile: a quick run by default, so that
`make test` stays fast. The full run, 10,000 examples per target:

    PODCERT_FUZZ_EXAMPLES=10000 .venv/bin/pytest tests/unit/test_hostile_input.py \
        --hypothesis-show-statistics

The per-test timeout grows with the example count, so no other flag is needed.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, get_args

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import event, given
from hypothesis import strategies as st

from bundles import formats, spiffe
from podcert import auditlog
from podcert.api import fields, keys, pods
from podcert.api.volumes import path_problem
from signer.auditlog.writer import AuditLog
from signer.issue.decide import DNS_NAMES_ANNOTATION
from tests.auditlog_world import Pki, make_pki
from tests.auditlog_world import entry as audit_entry
from tests.hostile_seeds import (
    CERT_SEEDS,
    DONORS,
    ED_KEY,
    ED_LEAF,
    FOREIGN_BLOCKS,
    INTERMEDIATE,
    KEY_SEEDS,
    LEAF,
    LEAF_KEY,
    OTHER_ROOT,
    ROOT,
    SECRETS,
    der,
    pkcs8,
)
from tests.signer_world import (
    NOW,
    SIGNER,
)
from tests.strategies import (
    FUZZ,
    FUZZ_TIMEOUT,
    HUGE_CONTENT,
    TREES,
    der_mutant,
    hostile_json,
    json_mutant,
)

pytestmark = FUZZ_TIMEOUT


# === credential and trust bundles ===============================================================

Block = tuple[bytes, bytes, bytes]  # label, DER, RFC 1421 headers
LABELS: Final = [
    b"PRIVATE KEY",
    b"CERTIFICATE",
    b"ENCRYPTED PRIVATE KEY",
    b"EC PRIVATE KEY",
    b"TRUSTED CERTIFICATE",
    b"X509 CERTIFICATE",
    b"PRIVATE  KEY",
    b"certificate",
    b"CERTIFICATE ",
    b"",
    b"X" * 65,
    b"CERT-IFICATE",
    b"\xc3\xa9",
]
BETWEEN: Final = [
    b"",
    b"",
    b"Subject: CN=x\n",
    b"\n\n\n",
    b"-----END CERTIFICATE-----\n",
    b"-----BEGIN \n",
    b"-----BEGIN CERTIFICATE-----",
    b"\x00\xff\xfe",
    b"-----",
]


def armour(block: Block, *, width: int, newline: bytes) -> bytes:
    label, der, headers = block
    body = base64.b64encode(der)
    lines = [body[i : i + width] for i in range(0, len(body), width)]
    return (
        b"-----BEGIN "
        + label
        + b"-----"
        + newline
        + headers
        + newline.join(lines)
        + newline
        + b"-----END "
        + label
        + b"-----"
        + newline
    )


POOL: Final[list[Block]] = [
    *((b"CERTIFICATE", der, b"") for der in CERT_SEEDS),
    *((b"PRIVATE KEY", der, b"") for der in KEY_SEEDS),
    *((label, der, b"") for label, der in FOREIGN_BLOCKS),
]
CREDENTIAL_SEEDS: Final[list[list[Block]]] = [
    [(b"PRIVATE KEY", pkcs8(LEAF_KEY), b""), *((b"CERTIFICATE", der(c), b"") for c in (LEAF,))],
    [
        (b"PRIVATE KEY", pkcs8(LEAF_KEY), b""),
        (b"CERTIFICATE", der(LEAF), b""),
        (b"CERTIFICATE", der(INTERMEDIATE.cert), b""),
    ],
    [(b"PRIVATE KEY", pkcs8(ED_KEY), b""), (b"CERTIFICATE", der(ED_LEAF), b"")],
]
TRUST_SEEDS: Final[list[list[Block]]] = [
    [(b"CERTIFICATE", der(c), b"") for c in (ROOT.cert, OTHER_ROOT.cert)],
    [(b"CERTIFICATE", der(c), b"") for c in (ROOT.cert, INTERMEDIATE.cert, ROOT.cert)],
]


@dataclass(frozen=True)
class Pem:
    """A bundle to build: the blocks, their armour and one raw edit. Strategies return this
    recipe, not the bytes, because Hypothesis keeps each example's drawn bytes for the rest of
    the run, and 10,000 bundles of up to 4 MiB do not fit in memory."""

    blocks: tuple[Block, ...]
    width: int = 64
    newline: bytes = b"\n"
    between: bytes = b""  # text before each block
    edit: str = "none"
    at: int = 0  # where the edit goes, modulo the length
    inserted: bytes = b""

    def build(self) -> bytes:
        data = b"".join(
            self.between + armour(block, width=self.width, newline=self.newline)
            for block in self.blocks
        )
        at = self.at % len(data) if data else 0
        if self.edit == "truncate":
            return data[:at]
        if self.edit == "flip" and data:
            return data[:at] + bytes([data[at] ^ self.inserted[0]]) + data[at + 1 :]
        if self.edit == "insert":
            return data[:at] + self.inserted + data[at:]
        if self.edit == "oversize":
            return data + b"\n" * (formats.MAX_BUNDLE_BYTES + 1 - len(data))
        return data


HUGE_BLOCKS: Final = [content * 10 for content in HUGE_CONTENT]  # 700 KB, under the size limit


@st.composite
def pem_mutant(draw: st.DrawFn, seeds: list[list[Block]]) -> Pem:
    """Seed blocks with edits to the block list, the armour and the DER inside, then maybe one
    raw edit to the bytes."""
    blocks = list(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 3))):
        how = draw(
            st.sampled_from(
                ["drop", "dup", "move", "insert", "relabel", "der", "headers", "many", "huge"]
            )
        )
        at = draw(st.integers(0, max(len(blocks) - 1, 0)))
        if not blocks:
            blocks.append(draw(st.sampled_from(POOL)))
        elif how == "drop":
            del blocks[at]
        elif how == "dup":
            blocks.insert(draw(st.integers(0, len(blocks))), blocks[at])
        elif how == "move":
            blocks.insert(draw(st.integers(0, len(blocks))), blocks.pop(at))
        elif how == "insert":
            blocks.insert(draw(st.integers(0, len(blocks))), draw(st.sampled_from(POOL)))
        elif how == "relabel":
            blocks[at] = (draw(st.sampled_from(LABELS)), *blocks[at][1:])
        elif how == "der":
            label, der, headers = blocks[at]
            damaged = (
                draw(der_mutant([der], DONORS)) if der in TREES else draw(st.binary(max_size=64))
            )
            blocks[at] = (label, damaged, headers)
        elif how == "headers":
            headers = draw(
                st.sampled_from([b"Proc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\n", b":\n"])
            )
            blocks[at] = (*blocks[at][:2], headers)
        elif how == "many":  # hundreds of copies: duplicate roots, or keys
            copies = min(draw(st.sampled_from([50, 300])), 2**21 // (len(blocks[at][1]) + 1))
            blocks += [blocks[at]] * copies
        else:  # one enormous block, still under the size limit
            blocks[at] = (blocks[at][0], draw(st.sampled_from(HUGE_BLOCKS)), b"")
    width = draw(st.sampled_from([64, 64, 76, 1, 10_000]))
    if width == 1 and sum(len(block[1]) for block in blocks) > 2**16:
        width = 64  # a bytes object per base64 character: keep an example's memory bounded
    edit = draw(
        st.sampled_from(
            ["none"] * 8 + ["truncate", "flip", "insert", "bad64", "truncate", "flip", "oversize"]
        )
    )
    inserted = b""
    if edit == "flip":
        inserted = bytes([1 << draw(st.integers(0, 7))])
    elif edit == "insert":
        inserted = draw(st.binary(min_size=1, max_size=24))
    elif edit == "bad64":
        edit, inserted = "insert", draw(st.sampled_from([b"=", b"*", b"==", b"\x00", b"-"]))
    return Pem(
        blocks=tuple(blocks),
        width=width,
        newline=draw(st.sampled_from([b"\n", b"\r\n", b"\n", b" "])),
        # Text before each block; one draw for all of them.
        between=draw(st.sampled_from(BETWEEN)) if draw(st.booleans()) else b"",
        edit=edit,
        at=draw(st.integers(0, 2**32)),
        inserted=inserted,
    )


def built(bundle: Pem | bytes) -> bytes:
    return bundle.build() if isinstance(bundle, Pem) else bundle


# A hostile certificate's non-positive serial draws a deprecation warning from cryptography
# (a future release refuses it outright); it is refused or loaded either way.
serial_warning = pytest.mark.filterwarnings(
    "ignore:Parsed a serial number:cryptography.utils.CryptographyDeprecationWarning"
)


def _clean(message: str) -> None:
    assert not [secret for secret in SECRETS if secret in message], "key material in a message"


@serial_warning
@FUZZ
@given(bundle=st.one_of(pem_mutant(CREDENTIAL_SEEDS), st.binary(max_size=200)))
def test_damaged_credential_bundles_raise_only_bundle_errors(bundle: Pem | bytes) -> None:
    try:
        credential = formats.load_credential(built(bundle))
    except formats.BundleError as exc:
        event(type(exc).__name__)
        _clean(str(exc))
        return
    event("loaded")
    _clean(repr(credential))
    _check_loaded_credential(credential)


KEY_FILE_SEEDS: Final[list[list[Block]]] = [[(b"PRIVATE KEY", pkcs8(LEAF_KEY), b"")]]
CHAIN_FILE_SEEDS: Final[list[list[Block]]] = [
    [(b"CERTIFICATE", der(LEAF), b"")],
    [(b"CERTIFICATE", der(LEAF), b""), (b"CERTIFICATE", der(INTERMEDIATE.cert), b"")],
]


@serial_warning
@FUZZ
@given(key=pem_mutant(KEY_FILE_SEEDS), chain=pem_mutant(CHAIN_FILE_SEEDS))
def test_damaged_key_and_chain_files_raise_only_bundle_errors(key: Pem, chain: Pem) -> None:
    # The kubelet's keyPath/certificateChainPath pair, each damaged on its own.
    try:
        credential = formats.load_credential_files(key.build(), chain.build())
    except formats.BundleError as exc:
        event(type(exc).__name__)
        _clean(str(exc))
        return
    event("loaded")
    _check_loaded_credential(credential)


def _check_loaded_credential(credential: formats.Credential) -> None:
    """What a consumer does next with a loaded credential raises only typed errors too."""
    assert credential.chain
    formats.describe(credential.leaf)
    try:
        credential.spiffe_id  # noqa: B018 - the property parses the SAN
    except spiffe.CertificateIdError as exc:
        event(f"no SPIFFE ID: {type(exc).__name__}")
    try:
        formats.verify_chain(credential, formats.TrustBundle((ROOT.cert,)), NOW)
    except formats.ChainError:
        event("chain refused")


@serial_warning
@FUZZ
@given(bundle=st.one_of(pem_mutant(TRUST_SEEDS), st.binary(max_size=200)))
def test_damaged_trust_bundles_raise_only_bundle_errors(bundle: Pem | bytes) -> None:
    try:
        trust = formats.load_trust_bundle(built(bundle))
    except formats.BundleError as exc:
        event(type(exc).__name__)
        return
    event(f"{len(trust.roots)} roots")
    assert len(set(trust.roots)) == len(trust.roots)
    assert formats.load_trust_bundle(formats.dump_trust_bundle(trust)) == trust
    assert trust.der()


# === the audit log reader =======================================================================

AUDIT_PKI: Final = make_pki("fuzz")
ROGUE_PKI: Final = make_pki("rogue")
AUDIT_NOW: Final = dt.datetime(2026, 5, 1, 13, 0, tzinfo=dt.UTC)


def _write_log() -> list[bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        with AuditLog(path, checkpoint_every=4) as log:
            log.set_checkpoint_signer(AUDIT_PKI.key, AUDIT_PKI.chain)
            for i in range(1, 15):
                log.append(audit_entry(i, "denied" if i % 5 == 0 else "issued"))
        return path.read_bytes().splitlines()


LOG: Final = _write_log()
LAST_CHECKPOINT: Final = max(
    i for i, line in enumerate(LOG) if json.loads(line)["kind"] == "checkpoint"
)
assert auditlog.verify(LOG, [AUDIT_PKI.root], AUDIT_NOW).ok


def _x5c(pki: Pki) -> list[str]:
    return [base64.b64encode(der(cert)).decode() for cert in pki.chain]


IATS: Final[list[Any]] = [
    int(AUDIT_NOW.timestamp()) - 60,
    0,
    -1,
    2**31,
    2**63,
    2**70,
    -(2**62),
    10**18,
    253402300800,
    1.5,
    "1",
    None,
    True,
]


@st.composite
def forged_checkpoint(draw: st.DrawFn, seq: int, prev: str) -> bytes:
    """A checkpoint line signed by a rogue key (or none) with hostile header and claims."""
    claims: dict[str, Any] = {
        "head": draw(st.sampled_from([prev, "0" * 64, "zz", 5, None])),
        "lines": draw(st.sampled_from([seq - 1, 0, -1, 2**64, "3", 1.0, None])),
        "iat": draw(st.sampled_from(IATS)),
    }
    if draw(st.booleans()):
        claims[draw(st.text(max_size=6))] = draw(hostile_json)
    x5c: Any = draw(
        st.one_of(
            st.just(_x5c(ROGUE_PKI)),
            st.just(_x5c(AUDIT_PKI)),  # the real chain, but a rogue signature
            der_mutant([der(ROGUE_PKI.chain[0])], DONORS).map(
                lambda der: [base64.b64encode(der).decode(), *_x5c(ROGUE_PKI)[1:]]
            ),
            st.sampled_from([[], ["!!"], [5], "abc", None, ["AAAA"] * 100]),
        )
    )
    headers = {"x5c": x5c} if x5c is not None else {}
    token = _sign(
        claims, headers, draw(st.sampled_from(["ES256", "ES256", "none", "HS256", "ES384"]))
    )
    if draw(st.booleans()):  # damage the compact form itself
        parts = token.split(".")
        i = draw(st.integers(0, len(parts) - 1))
        parts[i] = draw(
            st.sampled_from(
                [
                    "",
                    "e30",
                    "W10",
                    base64.urlsafe_b64encode(b"[" * 5000).decode(),
                    parts[i][:-1],
                    parts[i] + "A",
                    "%%%",
                ]
            )
        )
        token = ".".join(parts)
    line = {"seq": seq, "prev": prev, "kind": "checkpoint", "jwt": token}
    return auditlog.encode_line(line)


P384_KEY: Final = ec.generate_private_key(ec.SECP384R1())
# ECDSA signatures are random: one token per input, so that replaying an example's choices
# (Hypothesis does, to shrink) rebuilds the same lines and draws the same way.
_TOKENS: dict[str, str] = {}


def _sign(claims: dict[str, Any], headers: dict[str, Any], algorithm: str) -> str:
    key = json.dumps([claims, headers, algorithm], sort_keys=True)
    if key not in _TOKENS:
        signing_key: Any = {
            "ES256": ROGUE_PKI.key,
            "none": "",
            "HS256": "a shared secret" * 3,
            "ES384": P384_KEY,
        }[algorithm]
        _TOKENS[key] = jwt.encode(claims, signing_key, algorithm=algorithm, headers=headers)
    return _TOKENS[key]


GARBAGE_LINES: Final = [
    b"",
    b"null",
    b'"line"',
    b"[]",
    b"{}",
    b"[" * 100_000,
    b'{"seq":' * 50_000,
    b"1" * 5000,
    b'{"seq":1,"seq":2}',
    b"\xff\xfe",
    b"\xef\xbb\xbf" + LOG[0],
    LOG[0].decode().encode("utf-16"),
    LOG[0] + b"\r",
    LOG[0] + b"\n",
    b"x" * 300_000,
]


def rechain(lines: list[bytes], start: int) -> list[bytes]:
    """What a forger with write access does after an edit: renumber and recompute each prev."""
    out = lines[:start]
    for line in lines[start:]:
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            out.append(line)
            continue
        if isinstance(obj, dict):
            obj["seq"] = len(out) + 1
            obj["prev"] = auditlog.line_hash(out[-1]) if out else auditlog.GENESIS
            line = auditlog.encode_line(obj)
        out.append(line)
    return out


@st.composite
def log_mutant(draw: st.DrawFn) -> list[bytes]:
    lines = list(LOG)
    for _ in range(draw(st.integers(1, 3))):
        how = draw(
            st.sampled_from(
                [
                    "drop",
                    "dup",
                    "swap",
                    "truncate",
                    "flip",
                    "splice",
                    "field",
                    "extra-field",
                    "garbage",
                    "forge",
                    "forge",
                ]
            )
        )
        if not lines:
            lines.append(draw(st.sampled_from(GARBAGE_LINES)))
            continue
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        if how == "drop":
            del lines[i]
        elif how == "dup":
            lines.insert(draw(st.integers(0, len(lines))), line)
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif how == "truncate" and line:
            lines[i] = line[: draw(st.integers(0, len(line) - 1))]
        elif how == "flip" and line:
            at = draw(st.integers(0, len(line) - 1))
            flipped = bytes([line[at] ^ (1 << draw(st.integers(0, 7)))])
            lines[i] = line[:at] + flipped + line[at + 1 :]
        elif how == "splice":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.binary(min_size=1, max_size=16)) + line[at:]
        elif how in ("field", "extra-field"):
            obj = json.loads(line) if line[:1] == b"{" and _is_json(line) else None
            if isinstance(obj, dict):
                name = (
                    draw(st.sampled_from(sorted(obj)))
                    if how == "field" and obj
                    else draw(st.sampled_from(["private_key", "csr", "x", ""]))
                )
                obj[name] = draw(hostile_json.filter(_json_encodable))
                lines[i] = auditlog.encode_line(obj)
        elif how == "garbage":
            lines.insert(i, draw(st.sampled_from(GARBAGE_LINES)))
        else:
            prev = auditlog.line_hash(lines[i - 1]) if i else auditlog.GENESIS
            lines.insert(i, draw(forged_checkpoint(i + 1, prev)))
        if draw(st.booleans()):
            lines = rechain(lines, max(i, 0))
    return lines


def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):
        return False
    return True


def _json_encodable(value: Any) -> bool:
    try:
        auditlog.encode_line({"v": value})
    except (ValueError, TypeError, RecursionError):
        return False
    return True


@st.composite
def as_read(draw: st.DrawFn, lines: list[bytes]) -> list[bytes | str]:
    """The lines as bytes (how `podcert audit` reads them) or as text, as a caller that opened
    the file in text mode (undecodable bytes as surrogates) would pass them."""
    if draw(st.booleans()):
        return list(lines)
    return [line.decode("utf-8", "surrogateescape") for line in lines]


@FUZZ
@given(data=st.data(), lines=log_mutant(), anchored=st.booleans())
def test_audit_log_verify_reports_every_damage_and_never_raises(
    data: st.DataObject, lines: list[bytes], anchored: bool
) -> None:
    roots = [AUDIT_PKI.root] if anchored else None
    result = auditlog.verify(data.draw(as_read(lines)), roots, AUDIT_NOW)
    event("ok" if result.ok else "problems")
    assert result.ok == (result.first_broken_line is None)
    if result.first_broken_line is not None:
        assert 1 <= result.first_broken_line <= len(lines)
    assert result.entries + result.checkpoints <= len(lines)
    # Any change before the last checkpoint is caught, unless what is left is a true prefix of
    # the log (a truncated log is still a log; its tail is just not vouched for), or a prefix
    # followed by lines chained to it (anyone can chain an entry; no one without the key can sign
    # a checkpoint): then every changed line must be in the tail the log reports as unsigned.
    first_change = next(
        (i for i, (a, b) in enumerate(zip(lines, LOG, strict=False)) if a != b),
        min(len(lines), len(LOG)),
    )
    changed = roots is not None and first_change < LAST_CHECKPOINT and lines != LOG[: len(lines)]
    if changed and result.ok and result.anchored:
        assert len(lines) - first_change <= result.unsigned_tail, (first_change, result)


@FUZZ
@given(data=st.data(), lines=log_mutant())
def test_audit_log_iter_entries_raises_only_audit_log_errors(
    data: st.DataObject, lines: list[bytes]
) -> None:
    read = 0
    try:
        for found in auditlog.iter_entries(data.draw(as_read(lines))):
            assert found.time.utcoffset() is not None
            assert found.decision in get_args(auditlog.Decision)
            read += 1
    except auditlog.AuditLogError as exc:
        event("AuditLogError")
        assert exc.line_no is not None and read < exc.line_no <= len(lines)
        return
    event("read")


# === pods ========================================================================================


def _pod(sources: list[Any], *, extra_volumes: Sequence[Any] = ()) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid", "labels": {"a": "b"}},
        "spec": {
            "nodeName": "node-a",
            "serviceAccountName": "web",
            "containers": [{"name": "app", "image": "x"}],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {
                    "name": "identity",
                    "projected": {"defaultMode": 0o640, "defaultUser": 1000, "sources": sources},
                },
                *extra_volumes,
            ],
        },
    }


_BUNDLE_SOURCE: Final = {
    "podCertificate": {
        "signerName": SIGNER,
        "keyType": "ECDSAP256",
        "credentialBundlePath": "credentialbundle.pem",
        "maxExpirationSeconds": 3600,
        "userAnnotations": {DNS_NAMES_ANNOTATION: "a.web.svc"},
    }
}
_SPLIT_SOURCE: Final = {
    "podCertificate": {
        "signerName": SIGNER,
        "keyType": "ED25519",
        "keyPath": "tls/key.pem",
        "certificateChainPath": "tls/chain.pem",
        "user": 1001,
    }
}
_TRUST_SOURCES: Final = [
    {"clusterTrustBundle": {"name": "roots", "path": "trust/by-name.pem"}},
    {
        "clusterTrustBundle": {
            "signerName": SIGNER,
            "labelSelector": {
                "matchLabels": {"tier": "prod"},
                "matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a", "b"]},
                    {"key": "retired", "operator": "DoesNotExist"},
                ],
            },
            "optional": True,
            "path": "trust/by-signer.pem",
        }
    },
]
POD_SEEDS: Final = [
    _pod([_BUNDLE_SOURCE, _SPLIT_SOURCE, *_TRUST_SOURCES, {"configMap": {"name": "cm"}}]),
    _pod(
        [_BUNDLE_SOURCE],
        extra_volumes=[{"name": "more", "projected": {"sources": [_SPLIT_SOURCE]}}],
    ),
    # A hundred certificate sources in one volume, as the integration test sends the API.
    _pod(
        [
            {"podCertificate": {**_BUNDLE_SOURCE["podCertificate"], "credentialBundlePath": p}}
            for p in (f"c{i}.pem" for i in range(100))
        ]
    ),
]
VOLUME_ERROR_KINDS: Final = frozenset(get_args(fields.ErrorKind))


@FUZZ
@given(pod=st.one_of(json_mutant(POD_SEEDS, keep_root=False), hostile_json))
def test_damaged_pods_parse_into_work_items_and_field_errors_without_raising(pod: Any) -> None:
    parsed = pods.parse_pod(pod)
    event(f"{len(parsed.errors)} errors" if parsed.errors else "clean")
    for error in parsed.errors:
        assert error.kind in VOLUME_ERROR_KINDS
        assert error.field_path.startswith(("metadata", "spec")) or error.field_path == ""
        assert str(error)
    work = list(parsed.work_items())
    assert len({key for key, _ in work}) == len(work), "two work items share a key"
    for volume in parsed.volumes:
        paths: list[str] = []
        for source in volume.sources:
            if isinstance(source, pods.CertificateSource):
                assert source.key_type in keys.KEY_TYPES
                assert 3600 <= source.max_expiration_seconds <= 7862400
                paths += source.paths
            elif isinstance(source, pods.TrustBundleSource):
                paths.append(source.path)
        assert all(path_problem(p) is None for p in paths)
        # No two files of one volume at one path, and no file where another is a directory.
        for i, a in enumerate(paths):
            for b in paths[i + 1 :]:
                assert a != b and not a.startswith(b + "/") and not b.startswith(a + "/")


def test_the_seeds_are_valid_so_the_mutants_start_deep() -> None:
    """Each target's seeds pass its parser, so damage is found past the first check."""
    for blocks in CREDENTIAL_SEEDS:
        formats.load_credential(Pem(tuple(blocks)).build())
    for blocks in TRUST_SEEDS:
        formats.load_trust_bundle(Pem(tuple(blocks)).build())
    assert list(auditlog.iter_entries(LOG))
    for seed in POD_SEEDS:
        assert not pods.parse_pod(seed).errors


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b"[" * 100_000, id="a line nested 100000 deep"),
        pytest.param(b'{"seq":' * 50_000, id="an object nested 50000 deep"),
    ],
)
def test_a_deeply_nested_audit_line_is_a_malformed_line(line: bytes) -> None:
    result = auditlog.verify([LOG[0], line, *LOG[1:]], None, AUDIT_NOW)
    assert result.first_broken_line == 2
    with pytest.raises(auditlog.AuditLogError, match="line 2"):
        list(auditlog.iter_entries([LOG[0], line]))


def _signed_checkpoint(claims: dict[str, Any], chain: list[str]) -> bytes:
    token = jwt.encode(claims, ROGUE_PKI.key, algorithm="ES256", headers={"x5c": chain})
    return auditlog.encode_line(
        {"seq": 1, "prev": auditlog.GENESIS, "kind": "checkpoint", "jwt": token}
    )


_UNKNOWN_KEY_LEAF: Final = der(ROGUE_PKI.chain[0]).replace(
    bytes.fromhex("2a8648ce3d0201"), bytes.fromhex("2a8648ce3d0209"), 1
)


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        pytest.param(
            _signed_checkpoint({"head": auditlog.GENESIS, "lines": 0, "iat": 2**70}, []),
            "x5c",
            id="no certificate in x5c",
        ),
        *(
            pytest.param(
                _signed_checkpoint(
                    {"head": auditlog.GENESIS, "lines": 0, "n": 1, "iat": iat}, _x5c(ROGUE_PKI)
                ),
                "date",
                id=f"a signed checkpoint dated {iat}",
            )
            for iat in (2**70, 10**18, -(2**62))
        ),
        pytest.param(
            _signed_checkpoint(
                {"head": auditlog.GENESIS, "lines": 0, "iat": 1},
                [base64.b64encode(_UNKNOWN_KEY_LEAF).decode()],
            ),
            "key",
            id="an x5c leaf with an unknown key algorithm",
        ),
    ],
)
def test_hostile_checkpoints_are_problems_not_crashes(line: bytes, problem: str) -> None:
    for roots in (None, [AUDIT_PKI.root]):
        result = auditlog.verify([line], roots, AUDIT_NOW)
        assert result.first_broken_line == 1
        assert problem in " ".join(result.problems)


def test_a_text_line_that_is_not_utf8_is_a_malformed_line() -> None:
    text = [LOG[0].decode(), "\ud800", *(line.decode() for line in LOG[1:])]
    assert auditlog.verify(text, None, AUDIT_NOW).first_broken_line == 2
