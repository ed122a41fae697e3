"""A pod's projected volumes and their podCertificate and clusterTrustBundle sources, read once.

`parse_pod` reads a pod (the API's JSON dict) as the API server validates it; the node shim
serves what it returns and the audit joins the podCertificate sources with what it finds on
nodes. A pod is untrusted input: a malformed source becomes a `VolumeError` naming its field path
and its well-formed neighbours are still read. Nothing here raises on bad input.

A new file in a projection is a field of `CertificateSource` (or `TrustBundleSource`), read in
`_parse_certificate` and listed in `paths`; the shim's writer says what goes into it.
The kubelet's work item is one source: (pod UID, volume, source index), a `WorkKey`. Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from podcert.api.fields import ErrorKind, is_int, is_map, string
from podcert.api.keys import KEY_TYPES, KeyType
from podcert.api.selectors import LabelSelector, parse_selector
from podcert.api.validation import (
    DEFAULT_MAX_EXPIRATION_SECONDS,
    MAX_MAX_EXPIRATION_SECONDS,
    MIN_MAX_EXPIRATION_SECONDS,
    max_expiration_allowed,
)
from podcert.api.volumes import path_problem

# What a projected volume's files get when the pod sets no defaultMode.
DEFAULT_MODE: Final = 0o644


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
        """Every file this source projects, in the order the fields are declared."""
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
    """A projected source of another kind (configMap, secret, ...), kept for its index."""

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


class _Collector:
    """Accumulates errors while reading; each reader returns None when its field is unusable."""

    def __init__(self) -> None:
        self.errors: list[VolumeError] = []
        self.volume: str | None = None
        self.index: int | None = None

    def add(self, kind: ErrorKind, path: str, message: str) -> None:
        self.errors.append(VolumeError(kind, path, message, self.volume, self.index))

    def string(
        self, obj: Mapping[str, object], key: str, path: str, *, required: bool
    ) -> str | None:
        return string(self.add, obj, key, path, required=required)

    def rel_path(
        self, obj: Mapping[str, object], key: str, path: str, *, required: bool
    ) -> str | None:
        value = self.string(obj, key, path, required=required)
        if value is None:
            return None
        problem = path_problem(value)
        if problem is not None:
            self.add("Invalid", f"{path}.{key}", f"{value!r} {problem}")
            return None
        return value

    def user(self, obj: Mapping[str, object], key: str, path: str) -> tuple[bool, int | None]:
        value = obj.get(key)
        if value is None:
            return True, None
        if not is_int(value) or value < 0:
            self.add("Invalid", f"{path}.{key}", "must be a non-negative integer user ID")
            return False, None
        return True, value


def parse_pod(pod: object) -> PodVolumes:
    """Every projected volume of `pod` with its sources in order, plus what was wrong with it."""
    c = _Collector()
    if not is_map(pod):
        c.add("Invalid", "", "pod must be an object")
        return PodVolumes("", "", "", "", "", (), tuple(c.errors))
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    if not is_map(metadata):
        c.add("Required", "metadata", "must be an object")
        metadata = {}
    if not is_map(spec):
        c.add("Required", "spec", "must be an object")
        spec = {}
    namespace = c.string(metadata, "namespace", "metadata", required=True) or ""
    name = c.string(metadata, "name", "metadata", required=True) or ""
    uid = c.string(metadata, "uid", "metadata", required=True) or ""
    node_name = c.string(spec, "nodeName", "spec", required=False) or ""
    # The API server defaults an unset service account to "default".
    service_account = c.string(spec, "serviceAccountName", "spec", required=False) or "default"

    volumes: list[ProjectedVolume] = []
    raw_volumes = spec.get("volumes") or []
    if not isinstance(raw_volumes, list):
        c.add("Invalid", "spec.volumes", "must be a list")
        raw_volumes = []
    for v, raw in enumerate(raw_volumes):
        path = f"spec.volumes[{v}]"
        if not is_map(raw):
            c.add("Invalid", path, "must be an object")
            continue
        if "projected" not in raw:
            continue
        volume = _parse_volume(c, raw, path)
        if volume is None:
            continue
        if any(volume.name == earlier.name for earlier in volumes):
            # The API server refuses this; served anyway, both would share one directory and
            # one set of work items, each overwriting the other.
            c.volume, c.index = None, None
            c.add("Duplicate", f"{path}.name", f"{volume.name!r} names an earlier volume too")
            continue
        volumes.append(volume)
    return PodVolumes(
        namespace, name, uid, node_name, service_account, tuple(volumes), tuple(c.errors)
    )


def _parse_volume(c: _Collector, raw: Mapping[str, object], path: str) -> ProjectedVolume | None:
    c.volume, c.index = None, None
    name = c.string(raw, "name", path, required=True)
    if name is None:
        return None
    if path_problem(name) is not None or "/" in name:
        c.add("Invalid", f"{path}.name", f"{name!r} is not a volume name")
        return None
    c.volume = name
    projected = raw["projected"]
    path = f"{path}.projected"
    if not is_map(projected):
        c.add("Invalid", path, "must be an object")
        return None

    default_mode = DEFAULT_MODE
    mode = projected.get("defaultMode")
    if mode is not None:
        if is_int(mode) and 0 <= mode <= 0o777:
            default_mode = mode
        else:
            c.add("Invalid", f"{path}.defaultMode", "must be a mode between 0 and 0777 (511)")
    _, default_user = c.user(projected, "defaultUser", path)

    raw_sources = projected.get("sources") or []
    if not isinstance(raw_sources, list):
        c.add("Invalid", f"{path}.sources", "must be a list")
        raw_sources = []
    sources: list[Source] = []
    claimed: dict[str, int] = {}  # file path -> index of the source that writes it
    for index, raw_source in enumerate(raw_sources):
        c.index = index
        source_path = f"{path}.sources[{index}]"
        source = _parse_source(c, name, index, raw_source, source_path)
        if source is None:
            continue
        if not isinstance(source, UnsupportedSource) and not _claim(
            c, claimed, source, source_path
        ):
            continue
        sources.append(source)
    c.index = None
    return ProjectedVolume(name, default_mode, tuple(sources), default_user)


def _claim(
    c: _Collector,
    claimed: dict[str, int],
    source: CertificateSource | TrustBundleSource,
    path: str,
) -> bool:
    """Reserve the source's file paths; two files at one path (or a file over a directory) clash."""
    paths = source.paths if isinstance(source, CertificateSource) else (source.path,)
    mine: set[str] = set()
    for p in paths:
        for other in [*claimed, *mine]:
            if p == other or p.startswith(other + "/") or other.startswith(p + "/"):
                owner = claimed.get(other, source.index)
                c.add("Duplicate", path, f"path {p!r} clashes with {other!r} of sources[{owner}]")
                return False
        mine.add(p)
    claimed.update(dict.fromkeys(mine, source.index))
    return True


def _parse_source(c: _Collector, volume: str, index: int, raw: object, path: str) -> Source | None:
    if not is_map(raw):
        c.add("Invalid", path, "must be an object")
        return None
    kinds = [key for key, value in raw.items() if value is not None]
    if len(kinds) != 1:
        c.add("Invalid", path, f"must set exactly one source type, found {sorted(kinds) or 'none'}")
        return None
    kind = kinds[0]
    body = raw[kind]
    if kind == "podCertificate":
        if not is_map(body):
            c.add("Invalid", f"{path}.podCertificate", "must be an object")
            return None
        return _parse_certificate(c, volume, index, body, f"{path}.podCertificate")
    if kind == "clusterTrustBundle":
        if not is_map(body):
            c.add("Invalid", f"{path}.clusterTrustBundle", "must be an object")
            return None
        return _parse_trust_bundle(c, volume, index, body, f"{path}.clusterTrustBundle")
    return UnsupportedSource(volume, index, kind)


def _parse_certificate(
    c: _Collector, volume: str, index: int, body: Mapping[str, object], path: str
) -> CertificateSource | None:
    before = len(c.errors)
    signer_name = _signer_name(c, body, path, required=True)
    key_type: KeyType | None = None
    raw_key_type = c.string(body, "keyType", path, required=True)
    if raw_key_type is not None:
        for known in KEY_TYPES:
            if raw_key_type == known:
                key_type = known
        if key_type is None:
            c.add(
                "NotSupported",
                f"{path}.keyType",
                f"{raw_key_type!r}; supported: {', '.join(KEY_TYPES)}",
            )

    max_expiration = DEFAULT_MAX_EXPIRATION_SECONDS
    raw_max = body.get("maxExpirationSeconds")
    if raw_max is not None:
        if is_int(raw_max) and max_expiration_allowed(raw_max):
            max_expiration = raw_max
        else:
            c.add(
                "Invalid",
                f"{path}.maxExpirationSeconds",
                f"must be an integer in "
                f"[{MIN_MAX_EXPIRATION_SECONDS}, {MAX_MAX_EXPIRATION_SECONDS}]",
            )

    bundle = c.rel_path(body, "credentialBundlePath", path, required=False)
    key_path = c.rel_path(body, "keyPath", path, required=False)
    chain = c.rel_path(body, "certificateChainPath", path, required=False)
    if len(c.errors) == before and bundle is None and key_path is None and chain is None:
        c.add(
            "Required",
            path,
            "at least one of credentialBundlePath, keyPath, certificateChainPath must be set",
        )
    unique = [p for p in (bundle, key_path, chain) if p is not None]
    if len(set(unique)) != len(unique):
        c.add(
            "Duplicate", path, "credentialBundlePath, keyPath and certificateChainPath must differ"
        )

    annotations: dict[str, str] = {}
    raw_annotations = body.get("userAnnotations")
    if raw_annotations is not None:
        if is_map(raw_annotations) and all(isinstance(v, str) for v in raw_annotations.values()):
            annotations = {k: str(v) for k, v in raw_annotations.items()}
        else:
            c.add("Invalid", f"{path}.userAnnotations", "must map strings to strings")
    _, user = c.user(body, "user", path)

    if len(c.errors) != before or signer_name is None or key_type is None:
        return None
    return CertificateSource(
        volume=volume,
        index=index,
        signer_name=signer_name,
        key_type=key_type,
        max_expiration_seconds=max_expiration,
        credential_bundle_path=bundle,
        key_path=key_path,
        chain_path=chain,
        user_annotations=annotations,
        user=user,
    )


def _parse_trust_bundle(
    c: _Collector, volume: str, index: int, body: Mapping[str, object], path: str
) -> TrustBundleSource | None:
    before = len(c.errors)
    name = c.string(body, "name", path, required=False)
    signer_name = _signer_name(c, body, path, required=False)
    selector: LabelSelector | None = None
    raw_selector = body.get("labelSelector")
    if raw_selector is not None:
        selector = parse_selector(raw_selector, f"{path}.labelSelector", c.add)
    if name is not None and (signer_name is not None or raw_selector is not None):
        c.add("Invalid", path, "name is mutually exclusive with signerName and labelSelector")
    elif name is None and signer_name is None and len(c.errors) == before:
        c.add("Required", path, "one of name or signerName must be set")
    optional = body.get("optional", False)
    if optional is None:
        optional = False
    if not isinstance(optional, bool):
        c.add("Invalid", f"{path}.optional", "must be a boolean")
    file_path = c.rel_path(body, "path", path, required=True)
    _, user = c.user(body, "user", path)

    if len(c.errors) != before or file_path is None or not isinstance(optional, bool):
        return None
    return TrustBundleSource(volume, index, name, signer_name, selector, optional, file_path, user)


def _signer_name(
    c: _Collector, body: Mapping[str, object], path: str, *, required: bool
) -> str | None:
    value = c.string(body, "signerName", path, required=required)
    if value is None:
        return None
    domain, _, rest = value.partition("/")
    if not domain or not rest or "." not in domain:
        c.add("Invalid", f"{path}.signerName", f"{value!r} is not of the form <domain>/<path>")
        return None
    return value
