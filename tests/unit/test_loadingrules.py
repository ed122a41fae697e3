"""podcert.client.loadingrules: which files, merged how, which context, namespace and
impersonation, as clientcmd decides them (pinned to client-go itself by
tests/integration/test_reference_kubeconfig.py). Pure: documents are given as mappings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podcert.client.loadingrules import (
    ClientConfigError,
    Impersonation,
    kubeconfig_files,
    merge,
    namespace_of,
    select,
)
from podcert.client.loadingrules import impersonation as impersonating
from podcert.errors import ConfigError

HOME = Path("/home/op")


def doc(
    clusters: dict[str, str] | None = None,
    contexts: dict[str, dict[str, str]] | None = None,
    users: dict[str, dict[str, Any]] | None = None,
    current: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "clusters": [{"name": n, "cluster": {"server": s}} for n, s in (clusters or {}).items()],
        "contexts": [{"name": n, "context": c} for n, c in (contexts or {}).items()],
        "users": [{"name": n, "user": u} for n, u in (users or {}).items()],
    }
    if current is not None:
        out["current-context"] = current
    return out


@pytest.mark.parametrize(
    ("kubeconfig", "files"),
    [
        pytest.param(None, [HOME / ".kube/config"], id="unset: ~/.kube/config"),
        pytest.param("", [HOME / ".kube/config"], id="empty: ~/.kube/config"),
        pytest.param("/a:/b", [Path("/a"), Path("/b")], id="a list, in order"),
        pytest.param("/a::/b:", [Path("/a"), Path("/b")], id="empty entries dropped"),
        pytest.param("/b:/a:/b", [Path("/b"), Path("/a")], id="repeats dropped, first kept"),
    ],
)
def test_the_files_read_without_kubeconfig_flag(kubeconfig: str | None, files: list[Path]) -> None:
    environ = {} if kubeconfig is None else {"KUBECONFIG": kubeconfig}
    assert list(kubeconfig_files(environ, HOME)) == files


def test_the_first_file_to_define_a_name_wins_whole_and_sets_the_current_context() -> None:
    first = doc({"c": "https://first"}, {"x": {"cluster": "c"}})
    second = doc(
        {"c": "https://second", "d": "https://d"},
        {"x": {"cluster": "d"}, "y": {"cluster": "d", "namespace": "shop"}},
        current="y",
    )
    third = doc(current="x")

    merged = merge([(Path("/1/k"), first), (Path("/2/k"), second), (Path("/3/k"), third)])

    assert merged.current_context == "y"  # the first file that sets it
    assert merged.clusters["c"].value == {"server": "https://first"}
    assert merged.clusters["c"].base == Path("/1")  # relative names: from its own file's folder
    assert merged.clusters["d"].origin == Path("/2/k")
    assert merged.contexts["x"].value == {"cluster": "c"}
    assert select(merged).namespace == "shop"


def test_a_name_repeated_in_one_file_is_its_last_entry() -> None:
    one = doc()
    one["clusters"] = [
        {"name": "c", "cluster": {"server": "https://a"}},
        {"name": "c", "cluster": {"server": "https://b"}},
    ]
    assert merge([(Path("k"), one)]).clusters["c"].value == {"server": "https://b"}


def test_a_section_that_is_not_a_list_names_its_file() -> None:
    with pytest.raises(ClientConfigError, match=r"kubeconfig /k2: contexts: not a list"):
        merge([(Path("/k1"), doc()), (Path("/k2"), {"contexts": {"x": 1}})])


CONFIG = doc(
    {"c": "https://c"},
    {"a": {"cluster": "c", "user": "u"}, "b": {"cluster": "c", "namespace": "shop"}},
    {"u": {"token": "t"}},
    current="a",
)


@pytest.mark.parametrize(
    ("context", "chosen", "user", "namespace"),
    [
        pytest.param(None, "a", "u", "default", id="current context, no namespace: default"),
        pytest.param("b", "b", None, "shop", id="--context: its namespace"),
    ],
)
def test_the_context_and_its_namespace(
    context: str | None, chosen: str, user: str | None, namespace: str
) -> None:
    selected = select(merge([(Path("k"), CONFIG)]), context)
    assert (selected.context, selected.user_name, namespace_of(selected)) == (
        chosen,
        user,
        namespace,
    )


@pytest.mark.parametrize(
    ("document", "context", "says"),
    [
        pytest.param(CONFIG, "gone", "--context: no context named 'gone'", id="--context missing"),
        pytest.param(
            {**CONFIG, "current-context": "gone"},
            None,
            "current-context: no context",
            id="current-context missing",
        ),
        pytest.param(doc(), None, "current-context is not set (give --context)", id="none"),
        pytest.param(doc({}, {"a": {}}, current="a"), None, "cluster is not set", id="no cluster"),
        pytest.param(
            doc({}, {"a": {"cluster": "x"}}, current="a"),
            None,
            "no cluster named 'x'",
            id="a cluster the files lack",
        ),
        pytest.param(
            doc({"c": "s"}, {"a": {"cluster": "c", "user": "v"}}, current="a"),
            None,
            "no user named 'v'",
            id="a user the files lack",
        ),
    ],
)
def test_a_context_that_cannot_be_used_is_refused_by_name(
    document: dict[str, Any], context: str | None, says: str
) -> None:
    with pytest.raises(ClientConfigError) as raised:
        select(merge([(Path("k"), document)]), context)
    assert isinstance(raised.value, ConfigError)
    assert says in str(raised.value)


@pytest.mark.parametrize(
    ("user", "as_user", "as_groups", "expected"),
    [
        pytest.param({}, None, (), None, id="nobody"),
        pytest.param(
            {"as": "a", "as-groups": ["g"]},
            None,
            (),
            Impersonation("a", ("g",)),
            id="as, as-groups",
        ),
        pytest.param({"as": "a", "as-uid": "7"}, None, (), Impersonation("a", uid="7"), id="uid"),
        pytest.param({"as": "a"}, "b", (), Impersonation("b"), id="--as over as"),
        pytest.param(
            {"as": "a", "as-groups": ["g"]},
            None,
            ("h", "i"),
            Impersonation("a", ("h", "i")),
            id="--as-group replaces as-groups",
        ),
        pytest.param({}, "b", ("h",), Impersonation("b", ("h",)), id="flags alone"),
    ],
)
def test_whom_requests_impersonate(
    user: dict[str, Any],
    as_user: str | None,
    as_groups: tuple[str, ...],
    expected: Impersonation | None,
) -> None:
    assert impersonating(user, "user 'u'", as_user, as_groups) == expected


@pytest.mark.parametrize(
    ("user", "as_user", "as_groups", "says"),
    [
        pytest.param({}, None, ("g",), "--as-group given without a user", id="--as-group alone"),
        pytest.param(
            {"as-groups": ["g"]},
            None,
            (),
            "as-groups or as-uid given without",
            id="as-groups alone",
        ),
        pytest.param({"as-uid": "1"}, None, (), "as-uid given without", id="as-uid alone"),
        pytest.param(
            {"as": "a", "as-groups": "g"},
            None,
            (),
            "as-groups is not a list",
            id="groups: a string",
        ),
        pytest.param(
            {"as": "a", "as-user-extra": {"k": ["v"]}}, None, (), "as-user-extra", id="extra fields"
        ),
        pytest.param({}, "a\r\nX: y", (), "--as is not one line", id="a header injection"),
    ],
)
def test_impersonation_that_cannot_be_sent_is_refused_by_name(
    user: dict[str, Any], as_user: str | None, as_groups: tuple[str, ...], says: str
) -> None:
    with pytest.raises(ClientConfigError) as raised:
        impersonating(user, "user 'u'", as_user, as_groups)
    assert says in str(raised.value)
