"""The projections the shim must serve, as values: a pod's projected volumes, their
podCertificate and clusterTrustBundle sources, and the work items they make.

The agent works per (pod UID, volume, source index); `kubelet_shim.podspec` reads a pod spec
into these. Pure data.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple, get_args

from podcert.api.keys import KeyType

DEFAULT_MODE: Final = 0o644

ErrorKind = Literal["Required", "Invalid", "NotSupported", "Duplicate", "Forbidden"]
Operator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
OPERATORS: Final[tuple[Operator, ...]] = get_args(Operator)


@dataclass(frozen=True)
class VolumeError:
    """One problem in the pod spec, at an API field path such as `spec.volumes[0].projected`."""

    kind: ErrorKind
    field_path: str
    message: str
    volume: str | None = None
    index: int | None = None

    def __str__(self) -> str:
        return f"{self.field_path}: {self.kind}: {self.message}"


class WorkKey(NamedTuple):
    pod_uid: str
    volume: str
    source_index: int


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class LabelSelector:
    """A parsed metav1.LabelSelector; requirements are ANDed, an empty selector matches all."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class CertificateSource:
    volume: str
    index: int
    signer_name: str
    key_type: KeyType
    max_expiration_seconds: int
    credential_bundle_path: str | None
    key_path: str | None
    chain_path: str | None
    # Excluded from the hash (a dict is unhashable) but still part of equality.
    user_annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    user: int | None = None  # alpha AtomicWriteVolumeUserFields: file owner for this source

    def key(self, pod_uid: str) -> WorkKey:
        return WorkKey(pod_uid, self.volume, self.index)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(
            p
            for p in (self.credential_bundle_path, self.key_path, self.chain_path)
            if p is not None
        )


@dataclass(frozen=True)
class TrustBundleSource:
    volume: str
    index: int
    name: str | None
    signer_name: str | None
    # None means "match nothing" (the API's rule for an unset selector), () matches everything.
    label_selector: LabelSelector | None
    optional: bool
    path: str
    user: int | None = None

    def key(self, pod_uid: str) -> WorkKey:
        return WorkKey(pod_uid, self.volume, self.index)


@dataclass(frozen=True)
class UnsupportedSource:
    """A projected source the shim does not serve (configMap, secret, ...), kept for its index."""

    volume: str
    index: int
    kind: str


Source = CertificateSource | TrustBundleSource | UnsupportedSource


@dataclass(frozen=True)
class ProjectedVolume:
    name: str
    default_mode: int
    sources: tuple[Source, ...]
    default_user: int | None = None

    def owner_of(self, source: CertificateSource | TrustBundleSource) -> int | None:
        return source.user if source.user is not None else self.default_user


@dataclass(frozen=True)
class PodVolumes:
    namespace: str
    name: str
    uid: str
    node_name: str
    service_account: str
    volumes: tuple[ProjectedVolume, ...]
    errors: tuple[VolumeError, ...] = ()

    def work_items(self) -> Iterator[tuple[WorkKey, CertificateSource | TrustBundleSource]]:
        for volume in self.volumes:
            for source in volume.sources:
                if not isinstance(source, UnsupportedSource):
                    yield source.key(self.uid), source

    def errors_for(self, volume: str) -> tuple[VolumeError, ...]:
        return tuple(error for error in self.errors if error.volume == volume)
