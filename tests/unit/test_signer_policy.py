"""signer.policy: the file is checked strictly, and errors point at file, line and field."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from podcert.api import keys
from podcert.reconcile.ratelimit import Rate
from signer import policy

SERVED = ("example.com/podcert", "example.com/other")
NAME = SERVED[0]
EXAMPLE = """\
signers:
  - name: example.com/podcert
    trustDomain: prod.example.com
    maxLifetimeSeconds: 7200
    keyTypes: [ECDSAP256, ED25519]
    dnsNames:
      services: true
      clusterDomain: corp.local
      allowRequested: true
    allow:
      - namespaces: ["prod-*", web]
        serviceAccounts: ["*"]
      - namespaces: [ops]
        serviceAccounts: [deployer]
"""


def load(text: str) -> policy.Policy:
    return policy.load_policy(textwrap.dedent(text), "policy.yaml", SERVED, "cluster.local")


def test_default_policy_allows_everything_with_all_key_types_and_no_dns_names() -> None:
    signer = policy.default_policy([NAME], "cluster.local").for_signer(NAME)
    assert signer == policy.SignerPolicy(name=NAME, trust_domain="cluster.local")
    assert signer.max_lifetime == dt.timedelta(days=1)
    assert signer.key_types == frozenset(keys.KEY_TYPES)
    assert signer.dns == policy.DNSPolicy(
        services=False, cluster_domain="cluster.local", allow_requested=False
    )
    assert signer.allows("any-namespace", "any-account")


def test_full_example_loads_into_the_documented_types() -> None:
    signer = load(EXAMPLE).for_signer(NAME)
    assert signer == policy.SignerPolicy(
        name=NAME,
        trust_domain="prod.example.com",
        max_lifetime=dt.timedelta(hours=2),
        key_types=frozenset({"ECDSAP256", "ED25519"}),
        dns=policy.DNSPolicy(services=True, cluster_domain="corp.local", allow_requested=True),
        allow=(
            policy.AllowRule(namespaces=("prod-*", "web"), service_accounts=("*",)),
            policy.AllowRule(namespaces=("ops",), service_accounts=("deployer",)),
        ),
    )


@pytest.mark.parametrize(
    ("namespace", "account", "allowed"),
    [
        pytest.param("prod-eu", "anything", True, id="glob on namespace matches"),
        pytest.param("web", "frontend", True, id="exact namespace matches"),
        pytest.param("ops", "deployer", True, id="second rule matches"),
        pytest.param("ops", "intruder", False, id="second rule needs its service account"),
        pytest.param("prod", "frontend", False, id="glob needs its dash"),
        pytest.param("PROD-eu", "frontend", False, id="globs are case-sensitive"),
    ],
)
def test_allow_rules_match_namespace_and_service_account(
    namespace: str, account: str, allowed: bool
) -> None:
    assert load(EXAMPLE).for_signer(NAME).allows(namespace, account) is allowed


def test_served_signers_missing_from_the_file_get_defaults() -> None:
    loaded = load(EXAMPLE)
    assert set(loaded.signers) == set(SERVED)
    assert loaded.for_signer("example.com/other") == policy.SignerPolicy(
        name="example.com/other", trust_domain="cluster.local"
    )


@pytest.mark.parametrize("text", ["", "# nothing here\n", "signers: []\n"])
def test_empty_file_is_the_default_policy(text: str) -> None:
    assert load(text) == policy.default_policy(SERVED, "cluster.local")


def test_explicit_empty_allow_list_denies_everyone() -> None:
    signer = load(f"signers:\n  - name: {NAME}\n    allow: []\n").for_signer(NAME)
    assert not signer.allows("web", "default")


def test_rule_with_only_namespaces_matches_every_service_account() -> None:
    signer = load(f"signers:\n  - name: {NAME}\n    allow: [{{namespaces: [web]}}]\n")
    assert signer.for_signer(NAME).allows("web", "whatever")


def signer_yaml(body: str) -> str:
    """A one-signer file whose entry body starts on line 3."""
    return f"signers:\n  - name: {NAME}\n" + textwrap.indent(textwrap.dedent(body), "    ")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "signer: []\n",
            "policy.yaml:1: signer: unknown key; expected one of federation, signers",
            id="unknown top-level key",
        ),
        pytest.param("- a\n", "policy.yaml:1: (top level): expected a mapping", id="top is a list"),
        pytest.param("signers: {}\n", "policy.yaml:1: signers: expected a list", id="signers map"),
        pytest.param(
            signer_yaml("maxLifetime: 3600\n"),
            "policy.yaml:3: signers[0].maxLifetime: unknown key; expected one of allow, dnsNames",
            id="unknown signer key (typo)",
        ),
        pytest.param(
            "signers:\n  - trustDomain: a\n",
            "policy.yaml:2: signers[0].name: required",
            id="signer without a name",
        ),
        pytest.param(
            "signers:\n  - name: example.com/nope\n",
            "policy.yaml:2: signers[0].name: 'example.com/nope' is not served by this signer; "
            "served: example.com/podcert, example.com/other",
            id="signer name not served",
        ),
        pytest.param(
            f"signers:\n  - name: {NAME}\n  - name: {NAME}\n",
            "policy.yaml:3: signers[1].name: 'example.com/podcert' is listed twice",
            id="signer listed twice",
        ),
        pytest.param(
            signer_yaml("trustDomain: spiffe://cluster.local\n"),
            "policy.yaml:3: signers[0].trustDomain: must be a bare trust domain name, without a "
            "scheme",
            id="trust domain with scheme",
        ),
        pytest.param(
            signer_yaml("trustDomain: cluster.local:8443\n"),
            "policy.yaml:3: signers[0].trustDomain: must not carry a port",
            id="trust domain with port",
        ),
        pytest.param(
            signer_yaml("trustDomain: Cluster.Local\n"),
            "policy.yaml:3: signers[0].trustDomain: must be 1 to 255 characters of lowercase",
            id="trust domain with uppercase",
        ),
        pytest.param(
            signer_yaml("trustDomain: 42\n"),
            "policy.yaml:3: signers[0].trustDomain: expected a string, got int (42)",
            id="trust domain not a string",
        ),
        pytest.param(
            signer_yaml("maxLifetimeSeconds: 3599\n"),
            "policy.yaml:3: signers[0].maxLifetimeSeconds: 3599 is out of range; expected 3600",
            id="lifetime below one hour",
        ),
        pytest.param(
            signer_yaml("maxLifetimeSeconds: 7862401\n"),
            "policy.yaml:3: signers[0].maxLifetimeSeconds: 7862401 is out of range",
            id="lifetime above the API maximum",
        ),
        pytest.param(
            signer_yaml("maxLifetimeSeconds: 1d\n"),
            "policy.yaml:3: signers[0].maxLifetimeSeconds: expected an integer, "
            "got a string ('1d')",
            id="lifetime with a unit",
        ),
        pytest.param(
            signer_yaml("maxLifetimeSeconds: true\n"),
            "policy.yaml:3: signers[0].maxLifetimeSeconds: expected an integer, got a boolean",
            id="lifetime as boolean",
        ),
        pytest.param(
            signer_yaml("keyTypes: [ECDSAP256, RSA2048]\n"),
            "policy.yaml:3: signers[0].keyTypes[1]: unknown key type 'RSA2048'; expected one of "
            "RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519",
            id="unknown key type",
        ),
        pytest.param(
            signer_yaml("keyTypes: []\n"),
            "policy.yaml:3: signers[0].keyTypes: must list at least one key type",
            id="no key types",
        ),
        pytest.param(
            signer_yaml("keyTypes: ECDSAP256\n"),
            "policy.yaml:3: signers[0].keyTypes: expected a list",
            id="key types not a list",
        ),
        pytest.param(
            signer_yaml("dnsNames:\n  services: yes please\n"),
            "policy.yaml:4: signers[0].dnsNames.services: expected true or false, got a string",
            id="services not a boolean",
        ),
        pytest.param(
            signer_yaml("dnsNames:\n  allowRequested: 1\n"),
            "policy.yaml:4: signers[0].dnsNames.allowRequested: expected true or false, got int",
            id="allowRequested not a boolean",
        ),
        pytest.param(
            signer_yaml("dnsNames:\n  clusterDomain: -bad-.local\n"),
            "policy.yaml:4: signers[0].dnsNames.clusterDomain: '-bad-.local' is not a lowercase "
            "DNS name",
            id="bad cluster domain",
        ),
        pytest.param(
            signer_yaml("dnsNames:\n  service: true\n"),
            "policy.yaml:4: signers[0].dnsNames.service: unknown key; expected one of "
            "allowRequested, clusterDomain, services",
            id="unknown dnsNames key",
        ),
        pytest.param(
            signer_yaml("allow:\n  namespaces: [web]\n"),
            "policy.yaml:4: signers[0].allow: expected a list",
            id="allow is a mapping, not a list",
        ),
        pytest.param(
            signer_yaml("allow:\n  - namespaces: web\n"),
            "policy.yaml:4: signers[0].allow[0].namespaces: expected a list of strings",
            id="namespaces not a list",
        ),
        pytest.param(
            signer_yaml("allow:\n  - serviceAccounts: [default]\n  - namespaces: [a, 7]\n"),
            "policy.yaml:5: signers[0].allow[1].namespaces: expected a list of strings",
            id="namespace entry not a string",
        ),
        pytest.param(
            signer_yaml("allow:\n  - namespaces: []\n"),
            "policy.yaml:4: signers[0].allow[0].namespaces: an empty list matches nothing",
            id="empty namespaces list",
        ),
        pytest.param(
            signer_yaml("allow:\n  - serviceAccounts: [Default]\n"),
            "policy.yaml:4: signers[0].allow[0].serviceAccounts[0]: 'Default' is not a glob over "
            "Kubernetes names",
            id="uppercase glob never matches",
        ),
        pytest.param(
            signer_yaml("allow:\n  - namespace: [web]\n"),
            "policy.yaml:4: signers[0].allow[0].namespace: unknown key; expected one of "
            "namespaces, serviceAccounts",
            id="unknown rule key",
        ),
        pytest.param(
            signer_yaml("maxLifetimeSeconds: 3600\nmaxLifetimeSeconds: 7200\n"),
            "policy.yaml:4: signers[0].maxLifetimeSeconds: duplicate key",
            id="duplicate key",
        ),
        pytest.param(
            "signers:\n  - name: [unclosed\n",
            "policy.yaml:3: not valid YAML",
            id="YAML syntax error",
        ),
        pytest.param("a: 1\n---\nb: 2\n", "policy.yaml:2: not valid YAML", id="two documents"),
        pytest.param(
            "[" * 5000, "policy.yaml:1: not valid YAML: nested too deeply", id="deep nesting"
        ),
        pytest.param(
            "a:\n" + "".join(f"{'  ' * i}- b:\n" for i in range(1, 70)),
            "policy.yaml:33: not valid YAML: nested too deeply",
            id="deep block nesting",
        ),
        pytest.param(
            "\x00", "policy.yaml: not valid YAML: unacceptable character", id="NUL character"
        ),
        pytest.param(
            "signers:\n  - name: !!python/object:os.system x\n",
            "policy.yaml:2: signers[0].name: could not determine a constructor",
            id="python object tag is refused",
        ),
        pytest.param(
            "!!int signers:\n",
            "policy.yaml:1: (top level): 'signers' is not a valid int",
            id="an int tag on a word",
        ),
        pytest.param(
            "signers:\n  - name: !!bool maybe\n",
            "policy.yaml:2: signers[0].name: 'maybe' is not a valid bool",
            id="a bool tag on a word",
        ),
        pytest.param(
            f"signers:\n  - name: {NAME}\n    maxLifetimeSeconds: !!int ''\n",
            "policy.yaml:3: signers[0].maxLifetimeSeconds: '' is not a valid int",
            id="an int tag on nothing",
        ),
        pytest.param(
            "signers:\n  - name: !!timestamp soon\n",
            "policy.yaml:2: signers[0].name: 'soon' is not a valid timestamp",
            id="a timestamp tag on a word",
        ),
    ],
)
def test_bad_files_are_rejected_naming_file_line_and_field(text: str, message: str) -> None:
    with pytest.raises(policy.PolicyError) as caught:
        load(text)
    assert str(caught.value).startswith(message)


def test_bad_default_trust_domain_is_rejected() -> None:
    with pytest.raises(policy.PolicyError, match="--trust-domain"):
        policy.load_policy("", "policy.yaml", SERVED, "spiffe://x")
    with pytest.raises(policy.PolicyError, match="--trust-domain"):
        policy.default_policy(SERVED, "")


def test_load_policy_file_reads_and_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(EXAMPLE + "    bogus: 1\n")
    with pytest.raises(policy.PolicyError) as caught:
        policy.load_policy_file(path, SERVED, "cluster.local")
    assert str(caught.value).startswith(f"{path}:15: signers[0].bogus: unknown key")
    path.write_text(EXAMPLE)
    assert policy.load_policy_file(path, SERVED, "cluster.local") == load(EXAMPLE)


def test_missing_policy_file_is_a_policy_error(tmp_path: Path) -> None:
    with pytest.raises(policy.PolicyError, match="cannot read the policy file"):
        policy.load_policy_file(tmp_path / "absent.yaml", SERVED, "cluster.local")


# --- rateLimit ----------------------------------------------------------------------------------


def test_no_rate_limit_unless_the_policy_sets_one() -> None:
    assert load(EXAMPLE).for_signer(NAME).rate_per_node is None
    assert policy.default_policy([NAME], "cluster.local").for_signer(NAME).rate_per_node is None


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 50, burst: 100}}\n",
            Rate(per_second=50.0, burst=100),
            id="integer rate",
        ),
        pytest.param(
            "rateLimit:\n  perNode:\n    requestsPerSecond: 0.5\n    burst: 1\n",
            Rate(per_second=0.5, burst=1),
            id="fractional rate, smallest burst",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 0.01, burst: 100000}}\n",
            Rate(per_second=0.01, burst=100000),
            id="both bounds",
        ),
        pytest.param("rateLimit: {}\n", None, id="empty rateLimit is no limit"),
    ],
)
def test_rate_limits_load(body: str, expected: Rate | None) -> None:
    assert load(signer_yaml(body)).for_signer(NAME).rate_per_node == expected


def test_the_rate_limit_is_per_signer() -> None:
    text = (
        f"signers:\n  - name: {NAME}\n"
        "    rateLimit: {perNode: {requestsPerSecond: 5, burst: 10}}\n"
        f"  - name: {SERVED[1]}\n"
    )
    loaded = load(text)
    assert loaded.for_signer(NAME).rate_per_node == Rate(per_second=5.0, burst=10)
    assert loaded.for_signer(SERVED[1]).rate_per_node is None


PER_NODE = "policy.yaml:3: signers[0].rateLimit.perNode"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(
            "rateLimit: 50\n",
            "policy.yaml:3: signers[0].rateLimit: expected a mapping",
            id="rateLimit is a number",
        ),
        pytest.param(
            "rateLimit: {perPod: {}}\n",
            "policy.yaml:3: signers[0].rateLimit.perPod: unknown key; expected one of perNode",
            id="unknown kind of limit",
        ),
        pytest.param(
            "rateLimit: {perNode: 50}\n",
            f"{PER_NODE}: expected a mapping",
            id="perNode is a number",
        ),
        pytest.param(
            "rateLimit: {perNode: null}\n",
            f"{PER_NODE}: expected a mapping",
            id="perNode is null",
        ),
        pytest.param(
            "rateLimit: {perNode: {burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: required when perNode is set",
            id="rate missing",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 10}}\n",
            f"{PER_NODE}.burst: required when perNode is set",
            id="burst missing",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 10, burst: 10, qps: 5}}\n",
            f"{PER_NODE}.qps: unknown key; expected one of burst, requestsPerSecond",
            id="unknown field",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: fast, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a number, got a string ('fast')",
            id="rate is a word",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: '50', burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a number, got a string ('50')",
            id="rate is a quoted number",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: true, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a number, got a boolean (true)",
            id="rate is a boolean",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: [50], burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a number, got a list",
            id="rate is a list",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: .nan, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a finite number, got nan",
            id="rate is NaN",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: .inf, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a finite number, got inf",
            id="rate is infinite",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 0, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: 0.0 is out of range; expected 0.01 to 10000",
            id="zero rate",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: -5, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: -5.0 is out of range",
            id="negative rate",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 0.001, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: 0.001 is out of range",
            id="rate below one per 100 s",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 1000000, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: 1000000.0 is out of range",
            id="absurd rate",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 1e3, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: expected a number, got a string ('1e3')",
            id="1e3 is a string in YAML 1.1 and says so",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 10, burst: 0}}\n",
            f"{PER_NODE}.burst: 0 is out of range; expected 1 to 100000",
            id="zero burst",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 10, burst: 1000001}}\n",
            f"{PER_NODE}.burst: 1000001 is out of range",
            id="absurd burst",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 10, burst: 2.5}}\n",
            f"{PER_NODE}.burst: expected an integer, got float (2.5)",
            id="fractional burst",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: 10, burst: many}}\n",
            f"{PER_NODE}.burst: expected an integer, got a string ('many')",
            id="burst is a word",
        ),
        pytest.param(
            "rateLimit: {perNode: {requestsPerSecond: !!float x, burst: 10}}\n",
            f"{PER_NODE}.requestsPerSecond: 'x' is not a valid float",
            id="a float tag on a word",
        ),
    ],
)
def test_bad_rate_limits_are_rejected_naming_the_field(body: str, message: str) -> None:
    with pytest.raises(policy.PolicyError) as caught:
        load(signer_yaml(body))
    assert str(caught.value).startswith(message)


def test_the_shipped_policy_loads_and_limits_each_node() -> None:
    manifest = Path(__file__).resolve().parents[2] / "manifests" / "signer" / "policy.yaml"
    config_map = yaml.safe_load(manifest.read_text())
    shipped = policy.load_policy(
        config_map["data"]["policy.yaml"], str(manifest), ["podcert.dev/workload"], "cluster.local"
    )
    assert shipped.for_signer("podcert.dev/workload").rate_per_node == Rate(
        per_second=20.0, burst=300
    )


@pytest.mark.parametrize("limit", [1000, 100_000])
def test_a_deep_nesting_is_refused_the_same_whatever_the_recursion_limit(limit: int) -> None:
    """Test tools raise the interpreter's recursion limit; the answer must not change with it."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        with pytest.raises(policy.PolicyError, match="nested too deeply"):
            load("[" * 5000)
    finally:
        sys.setrecursionlimit(before)


# --- the JSON schema of an entry's policy fields (the chart's values.schema.json) -------------


def entry(fields: dict[str, object]) -> str:
    """A policy file with one entry: the served name and these fields, as JSON (valid YAML)."""
    return json.dumps({"signers": [{"name": NAME, **fields}]})


def objects(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema inside `schema`, with its path in the entry."""
    if schema.get("type") == "object":
        yield path, schema
        for key, sub in schema["properties"].items():
            yield from objects(sub, f"{path}.{key}".lstrip("."))
    if schema.get("type") == "array":
        yield from objects(schema["items"], path)


def test_the_schema_has_exactly_the_keys_the_reader_accepts_in_every_mapping() -> None:
    found = {path: schema for path, schema in objects(policy.entry_schema())}
    assert {path: tuple(s["properties"]) for path, s in found.items()} == {
        "": tuple(k for k in policy.SIGNER_KEYS if k not in ("name", "trustDomain")),
        "dnsNames": policy.DNS_KEYS,
        "allow": policy.RULE_KEYS,
        "rateLimit": policy.RATE_LIMIT_KEYS,
        "rateLimit.perNode": policy.PER_NODE_KEYS,
    }
    assert all(s["additionalProperties"] is False for s in found.values())
    # A key the schema does not name, the reader refuses too.
    for path in found:
        misspelt: dict[str, object] = {"keyTypo": 1}
        for key in reversed(path.split(".") if path else []):
            misspelt = {key: [misspelt] if key == "allow" else misspelt}
        with pytest.raises(policy.PolicyError, match="unknown key"):
            load(entry(misspelt))


@pytest.mark.parametrize(
    ("path", "build"),
    [
        pytest.param(
            ("maxLifetimeSeconds",), lambda v: {"maxLifetimeSeconds": v}, id="maxLifetimeSeconds"
        ),
        pytest.param(
            ("rateLimit", "perNode", "requestsPerSecond"),
            lambda v: {"rateLimit": {"perNode": {"requestsPerSecond": v, "burst": 1}}},
            id="requestsPerSecond",
        ),
        pytest.param(
            ("rateLimit", "perNode", "burst"),
            lambda v: {"rateLimit": {"perNode": {"requestsPerSecond": 1, "burst": v}}},
            id="burst",
        ),
    ],
)
def test_the_schemas_bounds_are_the_readers(
    path: tuple[str, ...], build: Callable[[object], dict[str, object]]
) -> None:
    schema = policy.entry_schema()
    for key in path:
        schema = schema["properties"][key]
    low, high = schema["minimum"], schema["maximum"]
    step = 1 if schema["type"] == "integer" else low / 2
    for inside in (low, high):
        load(entry(build(inside)))
    for outside in (low - step, high + step):
        with pytest.raises(policy.PolicyError, match="out of range"):
            load(entry(build(outside)))


def test_the_schemas_key_types_are_the_ones_the_reader_takes() -> None:
    names = policy.entry_schema()["properties"]["keyTypes"]["items"]["enum"]
    assert set(load(entry({"keyTypes": names})).for_signer(NAME).key_types) == set(names)
    with pytest.raises(policy.PolicyError, match="unknown key type"):
        load(entry({"keyTypes": ["DSA"]}))


@pytest.mark.parametrize("glob", ["prod-*", "web", "team-[ab]", "a.b?", "*", "Prod", "a b", "é"])
def test_the_schemas_glob_pattern_matches_what_the_reader_takes(glob: str) -> None:
    rule = policy.entry_schema()["properties"]["allow"]["items"]["properties"]["namespaces"]
    matches = re.fullmatch(rule["items"]["pattern"].strip("^$"), glob) is not None
    try:
        load(entry({"allow": [{"namespaces": [glob]}]}))
    except policy.PolicyError:
        taken = False
    else:
        taken = True
    assert matches == taken
