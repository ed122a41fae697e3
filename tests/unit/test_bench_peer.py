"""bench.peer: the Go signer's CA is a CA, its key private from the start, and the peer runs
with the flags its README gives."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509

from bench import peer

NOW = dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC)


def test_the_peers_ca_is_a_self_signed_ca_with_a_0600_key(tmp_path: Path) -> None:
    cert_path, key_path = peer.make_ca(tmp_path / "ca", NOW)
    assert key_path.stat().st_mode & 0o777 == 0o600
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    assert cert.issuer == cert.subject
    constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign
    assert cert.not_valid_before_utc <= NOW < cert.not_valid_after_utc


def test_the_peer_runs_as_the_admin_with_its_worker_count(tmp_path: Path) -> None:
    run = peer.Peer.for_cluster(Path("/bin/pcs"), tmp_path / "cluster", tmp_path, "a.b/c", 8)
    assert f"--kubeconfig={(tmp_path / 'cluster').resolve() / 'admin.kubeconfig'}" in run.args
    assert "--signer-name=a.b/c" in run.args
    assert "--max-concurrent-reconciles=8" in run.args
    assert not run.running and run.stop() is None


def test_the_peers_source_is_the_shared_folder_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PODCERT_PEER", raising=False)
    assert peer.source() == (peer.REPO.parent / "shared" / "peer").resolve()
    monkeypatch.setenv("PODCERT_PEER", str(tmp_path / "env"))
    assert peer.source() == (tmp_path / "env").resolve()
    assert peer.source(tmp_path) == tmp_path.resolve()
