"""Read a pod (the API's JSON dict) into the projections the shim must serve.

The agent works per (pod UID, volume, source index); this module turns the pod spec into those
work items (`kubelet_shim.volumes`). A pod is untrusted input: a malformed source becomes a
`VolumeError` naming its field path and its well-formed neighbours are still served. Nothing here
raises on bad input.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

from kubelet_shim.storage import path_problem
from kubelet_shim.volumes import (
    DEFAULT_MODE,
    OPERATORS,
    CertificateSource,
    ErrorKind,
    LabelSelector,
    Operator,
    PodVolumes,
    ProjectedVolume,
    Requirement,
    Source,
    TrustBundleSource,
    UnsupportedSource,
    VolumeError,
)
from podcert.api.keys import KEY_TYPES, KeyType
from podcert.api.lifetimes import (
    DEFAULT_MAX_EXPIRATION_SECONDS,
    MAX_MAX_EXPIRATION_SECONDS,
    MIN_MAX_EXPIRATION_SECONDS,
    max_expiration_allowed,
)


def _is_map(value: object) -> TypeGuard[Mapping[str, object]]:
    return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


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
        value = obj.get(key)
        if value is None or value == "":
            if required:
                self.add("Required", f"{path}.{key}", "must be set")
            return None
        if not isinstance(value, str):
            self.add("Invalid", f"{path}.{key}", f"must be a string, not {type(value).__name__}")
            return None
        return value

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
        if not _is_int(value) or value < 0:
            self.add("Invalid", f"{path}.{key}", "must be a non-negative integer user ID")
            return False, None
        return True, value


def parse_pod(pod: object) -> PodVolumes:
    """Every projected volume of `pod` with its sources in order, plus what was wrong with it."""
    c = _Collector()
    if not _is_map(pod):
        c.add("Invalid", "", "pod must be an object")
        return PodVolumes("", "", "", "", "", (), tuple(c.errors))
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    if not _is_map(metadata):
        c.add("Required", "metadata", "must be an object")
        metadata = {}
    if not _is_map(spec):
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
        if not _is_map(raw):
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
    if not _is_map(projected):
        c.add("Invalid", path, "must be an object")
        return None

    default_mode = DEFAULT_MODE
    mode = projected.get("defaultMode")
    if mode is not None:
        if _is_int(mode) and 0 <= mode <= 0o777:
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
    if not _is_map(raw):
        c.add("Invalid", path, "must be an object")
        return None
    kinds = [key for key, value in raw.items() if value is not None]
    if len(kinds) != 1:
        c.add("Invalid", path, f"must set exactly one source type, found {sorted(kinds) or 'none'}")
        return None
    kind = kinds[0]
    body = raw[kind]
    if kind == "podCertificate":
        if not _is_map(body):
            c.add("Invalid", f"{path}.podCertificate", "must be an object")
            return None
        return _parse_certificate(c, volume, index, body, f"{path}.podCertificate")
    if kind == "clusterTrustBundle":
        if not _is_map(body):
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
        if _is_int(raw_max) and max_expiration_allowed(raw_max):
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
        if _is_map(raw_annotations) and all(isinstance(v, str) for v in raw_annotations.values()):
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
        selector = _parse_selector(c, raw_selector, f"{path}.labelSelector")
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


def _parse_selector(c: _Collector, raw: object, path: str) -> LabelSelector | None:
    if not _is_map(raw):
        c.add("Invalid", path, "must be an object")
        return None
    before = len(c.errors)
    labels: list[tuple[str, str]] = []
    raw_labels = raw.get("matchLabels") or {}
    if _is_map(raw_labels) and all(isinstance(v, str) for v in raw_labels.values()):
        labels = sorted((k, str(v)) for k, v in raw_labels.items())
    else:
        c.add("Invalid", f"{path}.matchLabels", "must map strings to strings")

    requirements: list[Requirement] = []
    raw_expressions = raw.get("matchExpressions") or []
    if not isinstance(raw_expressions, list):
        c.add("Invalid", f"{path}.matchExpressions", "must be a list")
        raw_expressions = []
    for i, expression in enumerate(raw_expressions):
        requirement = _parse_requirement(c, expression, f"{path}.matchExpressions[{i}]")
        if requirement is not None:
            requirements.append(requirement)
    if len(c.errors) != before:
        return None
    return LabelSelector(tuple(labels), tuple(requirements))


def _parse_requirement(c: _Collector, raw: object, path: str) -> Requirement | None:
    if not _is_map(raw):
        c.add("Invalid", path, "must be an object")
        return None
    key = c.string(raw, "key", path, required=True)
    raw_operator = c.string(raw, "operator", path, required=True)
    operator: Operator | None = None
    for known in OPERATORS:
        if raw_operator == known:
            operator = known
    if raw_operator is not None and operator is None:
        c.add(
            "NotSupported", f"{path}.operator", f"{raw_operator!r}; one of {', '.join(OPERATORS)}"
        )
    raw_values = raw.get("values") or []
    if not isinstance(raw_values, list) or not all(isinstance(v, str) for v in raw_values):
        c.add("Invalid", f"{path}.values", "must be a list of strings")
        return None
    values = tuple(str(v) for v in raw_values)
    if key is None or operator is None:
        return None
    if operator in ("In", "NotIn") and not values:
        c.add("Required", f"{path}.values", f"must be non-empty for {operator}")
        return None
    if operator in ("Exists", "DoesNotExist") and values:
        c.add("Forbidden", f"{path}.values", f"must be empty for {operator}")
        return None
    return Requirement(key, operator, values)


def matches_selector(
    labels: Mapping[str, str], selector: LabelSelector | Mapping[str, object] | None
) -> bool:
    """Whether an object's labels satisfy a label selector.

    `None` matches nothing (the clusterTrustBundle rule for an unset selector) and an empty
    selector matches everything. A raw selector dict is parsed first; a malformed one raises
    ValueError, since quietly matching nothing or everything would both be wrong.
    """
    if selector is None:
        return False
    if not isinstance(selector, LabelSelector):
        c = _Collector()
        parsed = _parse_selector(c, selector, "labelSelector")
        if parsed is None:
            raise ValueError("; ".join(str(error) for error in c.errors))
        selector = parsed
    if any(labels.get(key) != value for key, value in selector.match_labels):
        return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        if requirement.operator == "Exists":
            ok = present
        elif requirement.operator == "DoesNotExist":
            ok = not present
        elif requirement.operator == "In":
            ok = present and labels[requirement.key] in requirement.values
        else:  # NotIn: an object without the label is not in any set
            ok = not present or labels[requirement.key] not in requirement.values
        if not ok:
            return False
    return True
