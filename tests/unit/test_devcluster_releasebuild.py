"""devcluster.releasebuild: one wrapper module and one `go build` for every binary of a release,
each binary written under its own name, the hollow kubelet's main our own."""

from __future__ import annotations

from pathlib import Path

import pytest

from devcluster import build
from devcluster.build import BuildError
from devcluster.releasebuild import MODULE, build_args, release_files

UPSTREAM = """module k8s.io/kubernetes

go 1.25.0

require k8s.io/api v0.0.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
)
"""


def components(*names: str, version: str = "1.37") -> list[build.Component]:
    return [build.kubernetes_component(name, version) for name in names]


def test_the_wrapper_names_every_upstream_main_and_holds_the_hollow_kubelets_own() -> None:
    files = release_files(components("kube-apiserver", "kubelet", "kubemark"), UPSTREAM)
    assert files["go.mod"].startswith(f"module {MODULE}\n\ngo 1.25.0\n")
    assert "require k8s.io/kubernetes v1.37.2" in files["go.mod"]
    assert "\tk8s.io/client-go => k8s.io/client-go v0.37.2\n" in files["go.mod"]
    assert files["tools.go"].startswith("//go:build tools\n")
    assert '\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n' in files["tools.go"]
    assert '\t_ "k8s.io/kubernetes/cmd/kubelet"\n' in files["tools.go"]
    assert "kubemark" not in files["tools.go"]
    assert files["kubemark/main.go"] == build.HOLLOW_MAIN_GO
    assert sorted(files) == ["go.mod", "kubemark/main.go", "tools.go"]


def test_one_build_writes_each_binary_under_its_name_with_the_releases_stamps() -> None:
    args = build_args(components("kube-apiserver", "kubemark"), Path("/w/out"))
    assert args[:3] == ["build", "-v", "-trimpath"]
    assert "-X k8s.io/component-base/version.gitVersion=v1.37.2" in args[3]
    assert args[3].startswith("-ldflags=-s -w ")
    packages = ["k8s.io/kubernetes/cmd/kube-apiserver", f"{MODULE}/kubemark"]
    assert args[4:] == ["-o", "/w/out/", *packages]


def test_binaries_of_two_releases_are_never_one_build() -> None:
    mixed = [*components("kube-apiserver"), *components("kubelet", version="1.36")]
    with pytest.raises(BuildError, match="one module and version"):
        release_files(mixed, UPSTREAM)
    with pytest.raises(BuildError, match="same version stamps"):
        build_args(mixed, Path("/w/out"))
