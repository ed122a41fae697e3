"""The wrapper go.mod that lets a module with local `replace` lines build from the module proxy."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from devcluster import build, pki

UPSTREAM = """module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tgithub.com/spf13/cobra v1.10.2
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go // a comment
\tgithub.com/some/fork => github.com/other/fork v1.2.3
)

replace k8s.io/kubelet => ./staging/src/k8s.io/kubelet
"""


def test_local_replaces_are_found_in_blocks_and_single_lines() -> None:
    assert build.local_replaces(UPSTREAM) == ["k8s.io/api", "k8s.io/client-go", "k8s.io/kubelet"]


def test_wrapper_pins_every_local_replace_to_the_published_version() -> None:
    text = build.wrapper_go_mod(build.KUBE_APISERVER, UPSTREAM)
    assert "go 1.26.0" in text
    assert "require k8s.io/kubernetes v1.37.2" in text
    assert "\tk8s.io/api => k8s.io/api v0.37.2\n" in text
    assert "\tk8s.io/kubelet => k8s.io/kubelet v0.37.2\n" in text
    # A replace to another module (not into the source tree) is not the wrapper's business.
    assert "github.com/other/fork" not in text


def test_etcd_submodules_share_the_server_version() -> None:
    upstream = (
        "module go.etcd.io/etcd/server/v3\n\ngo 1.26.0\n\nreplace (\n"
        "\tgo.etcd.io/etcd/api/v3 => ../api\n)\n"
    )
    text = build.wrapper_go_mod(build.ETCD, upstream)
    assert "\tgo.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 v3.7.3\n" in text


def test_apiserver_binary_is_stamped_with_its_version() -> None:
    assert "k8s.io/component-base/version.gitVersion=v1.37.2" in build.KUBE_APISERVER.stamps
    assert "k8s.io/component-base/version.gitMinor=37" in build.KUBE_APISERVER.stamps


def test_kubebuilder_assets_are_used_instead_of_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")
    for name in names:
        (tmp_path / name).write_text("#!/bin/sh\n")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    found = build.ensure_binaries(progress=lambda _line: None)
    assert found == build.Binaries(*(tmp_path / name for name in names))


NOW = dt.datetime(2026, 11, 29, 12, 0, tzinfo=dt.UTC)


def test_node_client_certificate_names_the_node_and_its_group() -> None:
    ca = pki.make_ca("test-ca", NOW)
    pair = pki.issue(ca, "system:node:node-a", NOW, organizations=("system:nodes",))
    cert = x509.load_pem_x509_certificate(pair.cert_pem)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node-a"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == "system:nodes"
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert_pem))


def test_private_files_are_0600_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    pki.write_private(path, b"secret")
    assert path.stat().st_mode & 0o777 == 0o600


def test_an_interop_program_is_rebuilt_when_its_sources_change(tmp_path: Path) -> None:
    for name, text in (("go.mod", "module m\n"), ("go.sum", ""), ("main.go", "package main\n")):
        (tmp_path / name).write_text(text)
    first = build.interop_digest(tmp_path)
    (tmp_path / "README.md").write_text("not a source")
    assert build.interop_digest(tmp_path) == first
    (tmp_path / "main.go").write_text("package main\n\nfunc main() {}\n")
    assert build.interop_digest(tmp_path) != first


def test_another_projects_module_is_rebuilt_when_any_of_its_go_files_changes(
    tmp_path: Path,
) -> None:
    for name, text in (("go.mod", "module m\n"), ("go.sum", ""), ("cmd/main.go", "package main\n")):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    flat, nested = build.interop_digest(tmp_path), build.interop_digest(tmp_path, nested=True)
    (tmp_path / "internal").mkdir()
    (tmp_path / "internal" / "x.go").write_text("package internal\n")
    assert build.interop_digest(tmp_path) == flat, "the tests' own programs keep their keys"
    assert build.interop_digest(tmp_path, nested=True) != nested
    # The same bytes under another path are another module.
    (tmp_path / "internal" / "x.go").rename(tmp_path / "internal" / "y.go")
    assert build.interop_digest(tmp_path, nested=True) not in (nested, flat)


def test_a_folder_without_a_go_mod_is_refused_before_go_runs(tmp_path: Path) -> None:
    with pytest.raises(build.BuildError, match=r"holds no go\.mod"):
        build.ensure_module_program(tmp_path, "x")


def test_the_gospiffe_checker_is_a_module_of_its_own() -> None:
    folder = build.interop_source("gospiffe")
    assert "github.com/spiffe/go-spiffe/v2 v2.9.0" in (folder / "go.mod").read_text()
    assert "github.com/spiffe/go-spiffe/v2 v2.9.0 h1:" in (folder / "go.sum").read_text()
