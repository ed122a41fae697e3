"""The signer's policy: who may get a certificate, for how long, and with which names.

Loaded once at start-up from a YAML file and validated strictly, so a typo stops the signer with
a message naming the file, the line and the field instead of silently widening or narrowing what
is issued. Pure: `load_policy` works on text; `load_policy_file` is the thin edge that reads it.

File shape (every key optional unless marked; unknown keys are errors)::

    signers:
      - name: example.com/podcert        # required; must be a signer name this process serves
        trustDomain: cluster.local        # SPIFFE trust domain; default: --trust-domain
        maxLifetimeSeconds: 86400         # leaf lifetime cap, 3600..7862400; default 86400
        keyTypes: [ECDSAP256, ED25519]    # accepted subject key types; default: all six
        dnsNames:
          services: false                 # issue <svc>.<ns>.svc and <svc>.<ns>.svc.<clusterDomain>
                                          #   for every Service selecting the pod; default false
          clusterDomain: cluster.local    # default cluster.local
          allowRequested: false           # honour the podcert.dev/dns-names annotation, for names
                                          #   the pod is entitled to only; default false
        allow:                            # default: one rule matching everything
          - namespaces: ["prod-*", web]   # fnmatch globs; default ["*"]
            serviceAccounts: ["*"]        # fnmatch globs; default ["*"]
        rateLimit:                        # default: no limit
          perNode:                        # a token bucket per node (spec.nodeName)
            requestsPerSecond: 50         # required; sustained rate, 0.01..10000
            burst: 100                    # required; requests at once after a quiet spell,
                                          #   1..100000

    federation: ...                       # other SPIFFE trust domains: signer.federation.domains

A request is allowed when any rule matches both its namespace and its service account;
`allow: []` denies everything. Signers that are served but not listed get every default.

The per-node rate limit is off unless set: the signer's fair queue already keeps one node's
flood from delaying the other nodes, and a limit that suits a cluster depends on its pods per
node (a kubelet restart re-requests every projection on the node at once). A node over its
rate is never denied: its requests wait for their turn in the bucket. Only issuances count:
a denial spends no token, so requests that merely name a node cannot drain its rate.

What a request may ask for through its annotations is read in `signer.issue.decide`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import re
import types
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml
from yaml.nodes import Node, SequenceNode

from podcert.api.keys import KEY_TYPES, KeyType
from podcert.api.validation import (
    DEFAULT_MAX_EXPIRATION_SECONDS,
    MAX_MAX_EXPIRATION_SECONDS,
    MIN_MAX_EXPIRATION_SECONDS,
    is_dns_name,
    max_expiration_allowed,
)
from podcert.errors import show
from podcert.reconcile.ratelimit import Rate
from signer.federation import domains as federation_
from signer.policyfile import PolicyError as PolicyError  # what load_policy raises
from signer.policyfile import PolicyReader, trust_domain_problem

DEFAULT_MAX_LIFETIME: Final = dt.timedelta(seconds=DEFAULT_MAX_EXPIRATION_SECONDS)
DEFAULT_CLUSTER_DOMAIN: Final = "cluster.local"
# Bounds of rateLimit.perNode: below one request per 100 s a node could not even start its
# pods; above these nothing is limited in practice, so a larger value is a typo.
MIN_RATE_PER_SECOND: Final = 0.01
MAX_RATE_PER_SECOND: Final = 10000.0
MAX_BURST: Final = 100000

# Globs over Kubernetes names: lowercase name characters plus fnmatch's * ? [ ] !.
_NAME_GLOB = re.compile(r"[a-z0-9.*?\[\]!-]+")

# The keys of each mapping in a `signers:` entry: what the reader accepts, and what
# `entry_schema` describes (the two cannot drift apart).
SIGNER_KEYS: Final = (
    "name",
    "trustDomain",
    "maxLifetimeSeconds",
    "keyTypes",
    "dnsNames",
    "allow",
    "rateLimit",
)
DNS_KEYS: Final = ("services", "clusterDomain", "allowRequested")
RULE_KEYS: Final = ("namespaces", "serviceAccounts")
RATE_LIMIT_KEYS: Final = ("perNode",)
PER_NODE_KEYS: Final = ("requestsPerSecond", "burst")
# Filled in by whoever writes the file (the chart: from signerNames and trustDomain).
_IDENTITY_KEYS: Final = ("name", "trustDomain")


@dataclass(frozen=True)
class AllowRule:
    namespaces: tuple[str, ...] = ("*",)
    service_accounts: tuple[str, ...] = ("*",)

    def matches(self, namespace: str, service_account: str) -> bool:
        return _any_glob(self.namespaces, namespace) and _any_glob(
            self.service_accounts, service_account
        )


@dataclass(frozen=True)
class DNSPolicy:
    services: bool = False
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    allow_requested: bool = False


@dataclass(frozen=True)
class SignerPolicy:
    name: str
    trust_domain: str
    max_lifetime: dt.timedelta = DEFAULT_MAX_LIFETIME
    key_types: frozenset[KeyType] = frozenset(KEY_TYPES)
    dns: DNSPolicy = field(default_factory=DNSPolicy)
    allow: tuple[AllowRule, ...] = (AllowRule(),)
    rate_per_node: Rate | None = None  # None: no per-node rate limit

    def allows(self, namespace: str, service_account: str) -> bool:
        return any(rule.matches(namespace, service_account) for rule in self.allow)


@dataclass(frozen=True)
class Policy:
    signers: Mapping[str, SignerPolicy]
    federation: federation_.Federation | None = None  # None: no federated trust domains

    def for_signer(self, signer_name: str) -> SignerPolicy:
        return self.signers[signer_name]


def default_policy(signer_names: Sequence[str], trust_domain: str) -> Policy:
    """Every served signer with the defaults: allow everything, all key types, no DNS names."""
    _check_default_trust_domain(trust_domain)
    return Policy(
        types.MappingProxyType(
            {name: SignerPolicy(name=name, trust_domain=trust_domain) for name in signer_names}
        )
    )


MAX_DEPTH: Final = 64
"""The deepest nesting of mappings and lists a policy file may have (the schema needs 5)."""


def _check_depth(text: str, source: str) -> None:
    """Refuse a file nested deeper than `MAX_DEPTH` before it is composed. PyYAML composes
    recursively, so without this a hostile nesting would be refused or not depending on the
    interpreter's recursion limit at that moment (which test tools raise); its parser is a state
    machine, so counting its events costs no recursion."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.MappingStartEvent | yaml.SequenceStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise PolicyError(
                    f"{source}:{line}: not valid YAML: nested too deeply (more than "
                    f"{MAX_DEPTH} levels of mappings and lists)"
                )
        elif isinstance(event, yaml.MappingEndEvent | yaml.SequenceEndEvent):
            depth -= 1


def load_policy(text: str, source: str, served: Sequence[str], default_trust_domain: str) -> Policy:
    """Parse and validate a policy file's `text`; `source` names it in error messages."""
    _check_default_trust_domain(default_trust_domain)
    try:
        _check_depth(text, source)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f"{mark.line + 1}:" if mark is not None else ""
        raise PolicyError(f"{source}:{line} not valid YAML: {exc.problem or exc}") from exc
    except yaml.YAMLError as exc:  # e.g. a forbidden character, reported without a line
        raise PolicyError(f"{source}: not valid YAML: {str(exc).splitlines()[0]}") from exc
    except RecursionError as exc:  # a backstop: `_check_depth` refuses such files first
        raise PolicyError(f"{source}: not valid YAML: nested too deeply") from exc
    signers: dict[str, SignerPolicy] = {}
    federated = None
    if root is not None:  # an empty file is the default policy
        reader = _Reader(source)
        top = reader.mapping(root, "", {"signers", "federation"})
        if "signers" in top:
            _, value = top["signers"]
            for index, item in enumerate(reader.sequence(value, "signers")):
                signer = reader.signer(item, f"signers[{index}]", served, default_trust_domain)
                if signer.name in signers:
                    raise reader.error(
                        item, f"signers[{index}].name", f"{signer.name!r} is listed twice"
                    )
                signers[signer.name] = signer
        if "federation" in top:
            own = {s.trust_domain for s in signers.values()} | {default_trust_domain}
            federated = federation_.read_section(reader, top["federation"][1], served, own)
    for name in served:
        signers.setdefault(name, SignerPolicy(name=name, trust_domain=default_trust_domain))
    return Policy(types.MappingProxyType(signers), federated)


def load_policy_file(path: Path, served: Sequence[str], default_trust_domain: str) -> Policy:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(f"{path}: cannot read the policy file: {exc}") from exc
    return load_policy(text, str(path), served, default_trust_domain)


def entry_schema() -> dict[str, Any]:
    """The JSON schema (draft 7) of a `signers:` entry's policy fields, every key but `name` and
    `trustDomain`: what the chart's `policy` value holds (values.schema.json carries it, made by
    `make chart`). Built from the reader's own key sets, key types and bounds, so whatever the
    schema refuses the signer refuses too; the signer checks more at start-up (a cluster domain
    is a DNS name, ...)."""
    globs = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "string", "pattern": f"^{_NAME_GLOB.pattern}$"},
    }
    per_node = _object(
        PER_NODE_KEYS,
        {
            "requestsPerSecond": {
                "type": "number",
                "minimum": MIN_RATE_PER_SECOND,
                "maximum": MAX_RATE_PER_SECOND,
            },
            "burst": {"type": "integer", "minimum": 1, "maximum": MAX_BURST},
        },
        required=PER_NODE_KEYS,
    )
    fields = {
        "maxLifetimeSeconds": {
            "type": "integer",
            "minimum": MIN_MAX_EXPIRATION_SECONDS,
            "maximum": MAX_MAX_EXPIRATION_SECONDS,
        },
        "keyTypes": {"type": "array", "minItems": 1, "items": {"enum": list(KEY_TYPES)}},
        "dnsNames": _object(
            DNS_KEYS,
            {
                "services": {"type": "boolean"},
                "clusterDomain": {"type": "string", "minLength": 1},
                "allowRequested": {"type": "boolean"},
            },
        ),
        "allow": {
            "type": "array",
            "items": _object(RULE_KEYS, {"namespaces": globs, "serviceAccounts": globs}),
        },
        "rateLimit": _object(RATE_LIMIT_KEYS, {"perNode": per_node}),
    }
    keys = tuple(k for k in SIGNER_KEYS if k not in _IDENTITY_KEYS)
    return _object(keys, fields)


def _object(
    keys: Sequence[str], properties: dict[str, Any], required: Sequence[str] = ()
) -> dict[str, Any]:
    """A closed JSON schema object with exactly `keys` (a mismatch is this module's bug)."""
    if set(properties) != set(keys):
        raise ValueError(f"schema properties {sorted(properties)} are not the keys {sorted(keys)}")
    schema: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {key: properties[key] for key in keys},
    }
    if required:
        schema["required"] = list(required)
    return schema


def _any_glob(patterns: Collection[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _check_default_trust_domain(trust_domain: str) -> None:
    problem = trust_domain_problem(trust_domain)
    if problem is not None:
        raise PolicyError(f"default trust domain (--trust-domain) {show(trust_domain)}: {problem}")


class _Reader(PolicyReader):
    """The signer entries of the policy file, read on the file's node walker."""

    def signer(
        self, node: Node, path: str, served: Sequence[str], default_trust_domain: str
    ) -> SignerPolicy:
        keys = self.mapping(node, path, SIGNER_KEYS)
        if "name" not in keys:
            raise self.error(node, f"{path}.name", "required: the signer name this entry is for")
        name_node = keys["name"][1]
        name = self.string(name_node, f"{path}.name")
        if name not in served:
            raise self.error(
                name_node,
                f"{path}.name",
                f"{name!r} is not served by this signer; served: {', '.join(served) or 'none'}",
            )
        policy = SignerPolicy(name=name, trust_domain=default_trust_domain)
        if "trustDomain" in keys:
            value = keys["trustDomain"][1]
            trust_domain = self.string(value, f"{path}.trustDomain")
            problem = trust_domain_problem(trust_domain)
            if problem is not None:
                raise self.error(value, f"{path}.trustDomain", problem)
            policy = dataclasses.replace(policy, trust_domain=trust_domain)
        if "maxLifetimeSeconds" in keys:
            value = keys["maxLifetimeSeconds"][1]
            seconds = self.integer(value, f"{path}.maxLifetimeSeconds")
            # The API's bounds on maxExpirationSeconds: outside them it could never be honoured.
            if not max_expiration_allowed(seconds):
                raise self.error(
                    value,
                    f"{path}.maxLifetimeSeconds",
                    f"{seconds} is out of range; expected {MIN_MAX_EXPIRATION_SECONDS} (1 h) to "
                    f"{MAX_MAX_EXPIRATION_SECONDS} (91 d)",
                )
            policy = dataclasses.replace(policy, max_lifetime=dt.timedelta(seconds=seconds))
        if "keyTypes" in keys:
            policy = dataclasses.replace(
                policy, key_types=self.key_types(keys["keyTypes"][1], path)
            )
        if "dnsNames" in keys:
            policy = dataclasses.replace(
                policy, dns=self.dns(keys["dnsNames"][1], f"{path}.dnsNames")
            )
        if "allow" in keys:
            value = keys["allow"][1]
            rules = tuple(
                self.rule(item, f"{path}.allow[{index}]")
                for index, item in enumerate(self.sequence(value, f"{path}.allow"))
            )
            policy = dataclasses.replace(policy, allow=rules)
        if "rateLimit" in keys:
            rate = self.rate_limit(keys["rateLimit"][1], f"{path}.rateLimit")
            policy = dataclasses.replace(policy, rate_per_node=rate)
        return policy

    def rate_limit(self, node: Node, path: str) -> Rate | None:
        keys = self.mapping(node, path, RATE_LIMIT_KEYS)
        if "perNode" not in keys:
            return None  # `rateLimit: {}` says "no limit" explicitly
        value = keys["perNode"][1]
        path = f"{path}.perNode"
        fields = self.mapping(value, path, PER_NODE_KEYS)
        for name in PER_NODE_KEYS:
            if name not in fields:
                raise self.error(value, f"{path}.{name}", "required when perNode is set")
        rate_node = fields["requestsPerSecond"][1]
        rate = self.number(rate_node, f"{path}.requestsPerSecond")
        if not MIN_RATE_PER_SECOND <= rate <= MAX_RATE_PER_SECOND:
            raise self.error(
                rate_node,
                f"{path}.requestsPerSecond",
                f"{rate} is out of range; expected {MIN_RATE_PER_SECOND} to "
                f"{MAX_RATE_PER_SECOND:.0f}",
            )
        burst_node = fields["burst"][1]
        burst = self.integer(burst_node, f"{path}.burst")
        if not 1 <= burst <= MAX_BURST:
            raise self.error(
                burst_node, f"{path}.burst", f"{burst} is out of range; expected 1 to {MAX_BURST}"
            )
        return Rate(per_second=float(rate), burst=burst)

    def key_types(self, node: Node, signer_path: str) -> frozenset[KeyType]:
        path = f"{signer_path}.keyTypes"
        found: set[KeyType] = set()
        for index, item in enumerate(self.sequence(node, path)):
            name = self.string(item, f"{path}[{index}]")
            key_type = next((k for k in KEY_TYPES if k == name), None)
            if key_type is None:
                raise self.error(
                    item,
                    f"{path}[{index}]",
                    f"unknown key type {name!r}; expected one of {', '.join(KEY_TYPES)}",
                )
            found.add(key_type)
        if not found:
            raise self.error(node, path, "must list at least one key type")
        return frozenset(found)

    def dns(self, node: Node, path: str) -> DNSPolicy:
        keys = self.mapping(node, path, DNS_KEYS)
        policy = DNSPolicy()
        if "services" in keys:
            policy = dataclasses.replace(
                policy, services=self.boolean(keys["services"][1], f"{path}.services")
            )
        if "allowRequested" in keys:
            allow = self.boolean(keys["allowRequested"][1], f"{path}.allowRequested")
            policy = dataclasses.replace(policy, allow_requested=allow)
        if "clusterDomain" in keys:
            value = keys["clusterDomain"][1]
            domain = self.string(value, f"{path}.clusterDomain")
            if not is_dns_name(domain):
                raise self.error(
                    value, f"{path}.clusterDomain", f"{domain!r} is not a lowercase DNS name"
                )
            policy = dataclasses.replace(policy, cluster_domain=domain)
        return policy

    def rule(self, node: Node, path: str) -> AllowRule:
        keys = self.mapping(node, path, RULE_KEYS)
        rule = AllowRule()
        if "namespaces" in keys:
            rule = dataclasses.replace(
                rule, namespaces=self.globs(keys["namespaces"][1], f"{path}.namespaces")
            )
        if "serviceAccounts" in keys:
            globs = self.globs(keys["serviceAccounts"][1], f"{path}.serviceAccounts")
            rule = dataclasses.replace(rule, service_accounts=globs)
        return rule

    def globs(self, node: Node, path: str) -> tuple[str, ...]:
        if not isinstance(node, SequenceNode):
            raise self.error(node, path, "expected a list of strings")
        patterns: list[str] = []
        for index, item in enumerate(node.value):
            value = self.scalar(item, f"{path}[{index}]")
            if not isinstance(value, str):
                raise self.error(item, path, "expected a list of strings")
            if not _NAME_GLOB.fullmatch(value):
                raise self.error(
                    item,
                    f"{path}[{index}]",
                    f"{value!r} is not a glob over Kubernetes names (lowercase letters, digits, "
                    "'-', '.', and the wildcards * ? [...])",
                )
            patterns.append(value)
        if not patterns:
            raise self.error(
                node, path, "an empty list matches nothing; omit the key to match everything"
            )
        return tuple(patterns)
