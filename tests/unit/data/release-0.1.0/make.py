"""Writes this folder's fixtures with release 0.1.0's own code, for the tests that today's code
reads what 0.1.0 persisted (tests/unit/test_persisted.py). Run from a checkout of 0.1.0:

    git worktree add /tmp/podcert-0.1.0 bd959f9
    cd /tmp/podcert-0.1.0 && PYTHONPATH=. /work/main/.venv/bin/python \\
        /work/main/tests/unit/data/release-0.1.0/make.py /work/main/tests/unit/data/release-0.1.0

- ca-secret.json: the data of the CA Secret 0.1.0's CAStore creates, then after its `prepare`
  step (two generations, the SPIFFE sequence), base64 per key as the API holds it. Test keys.
- audit.jsonl: 0.1.0's AuditLog: five decisions, a checkpoint every two, and a last one; the
  checkpoints' audit certificate is issued by the Secret's active CA.

Every time is fixed (NOW below); the tests read the fixtures at those times.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from signer import auditlog, certs, rotation
from signer.castore import CAStore

NOW = dt.datetime(2026, 12, 1, 16, 0, 0, tzinfo=dt.UTC)
NAMESPACE, NAME = "podcert-system", "podcert-ca"


class SecretKube:
    """The three calls CAStore makes of the API, on one Secret held in memory."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] | None = None
        self.version = 0

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        return None if self.data is None else (dict(self.data), str(self.version))

    def create_secret(self, namespace, name, data, labels) -> bool:  # type: ignore[no-untyped-def]
        self.data, self.version = dict(data), 1
        return True

    def replace_secret(self, namespace, name, data, version, labels) -> str:  # type: ignore[no-untyped-def]
        assert version == str(self.version)
        self.data, self.version = dict(data), self.version + 1
        return str(self.version)


def main(out: Path) -> None:
    import signer

    print("writing with", Path(signer.__file__).parent)
    kube = SecretKube()
    store = CAStore(kube, NAMESPACE, NAME, lambda: NOW)  # type: ignore[arg-type]
    store.load()
    store.step(rotation.Prepare())
    assert kube.data is not None
    encoded = {k: base64.b64encode(v).decode() for k, v in sorted(kube.data.items())}
    (out / "ca-secret.json").write_text(json.dumps(encoded, indent=1) + "\n")

    issuer = store.issuing()
    assert issuer is not None
    key = ec.generate_private_key(ec.SECP256R1())
    pem = certs.sign_audit_certificate(
        key.public_key(), "cluster.local", issuer, NOW, NOW + dt.timedelta(days=30), 1
    )
    chain = list(x509.load_pem_x509_certificates(pem.encode()))
    path = out / "audit.jsonl"
    path.unlink(missing_ok=True)
    with auditlog.AuditLog(path, checkpoint_every=2) as log:
        log.set_checkpoint_signer(key, chain)
        log.checkpoint(key, chain, NOW, force=True)
        for n in range(5):
            issued = n % 2 == 0
            log.append(
                auditlog.Entry(
                    time=NOW + dt.timedelta(seconds=n + 1),
                    namespace="shop",
                    name=f"web-{n}-pcr",
                    uid=f"00000000-0000-0000-0000-00000000000{n}",
                    pod=f"web-{n}",
                    node="node-a",
                    service_account="web",
                    decision="issued" if issued else "denied",
                    reason="Issued" if issued else "PodNotFound",
                    signer_name="example.com/podcert",
                    spiffe_id="spiffe://cluster.local/ns/shop/sa/web" if issued else None,
                    serial=f"{n + 1:04x}" if issued else None,
                    not_before=NOW if issued else None,
                    not_after=NOW + dt.timedelta(hours=24) if issued else None,
                )
            )
        log.checkpoint(key, chain, NOW + dt.timedelta(seconds=10))
    path.chmod(0o644)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
