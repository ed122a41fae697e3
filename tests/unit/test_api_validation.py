"""podcert.api.validation: which strings are Kubernetes names (the one rule the signer checks a
request's names, the DNS names it issues and its policy file's cluster domain against)."""

from __future__ import annotations

import pytest

from podcert.api.validation import is_dns_label, is_dns_name


@pytest.mark.parametrize(
    ("name", "label", "subdomain"),
    [
        pytest.param("prod", True, True, id="a lowercase word is both"),
        pytest.param("a-1", True, True, id="dashes inside and digits are allowed"),
        pytest.param("0", True, True, id="one digit is a name"),
        pytest.param("web.prod.svc", False, True, id="dots make a subdomain, not a label"),
        pytest.param("a" * 63, True, True, id="a label may have 63 characters"),
        pytest.param("a" * 64, False, False, id="a label of 64 characters is too long"),
        pytest.param(".".join(["a" * 63] * 4)[:253], False, True, id="253 characters in all"),
        pytest.param(".".join(["a" * 63] * 4), False, False, id="255 characters is too long"),
        pytest.param("", False, False, id="empty"),
        pytest.param("Prod", False, False, id="uppercase"),
        pytest.param("-a", False, False, id="a leading dash"),
        pytest.param("a-", False, False, id="a trailing dash"),
        pytest.param("a..b", False, False, id="an empty label"),
        pytest.param("a.", False, False, id="a trailing dot"),
        pytest.param("*.prod.svc", False, False, id="a wildcard"),
        pytest.param("a_b", False, False, id="an underscore"),
        pytest.param("a\nb", False, False, id="a newline"),
        pytest.param("é", False, False, id="non-ASCII"),
    ],
)
def test_dns_labels_and_subdomains(name: str, label: bool, subdomain: bool) -> None:
    assert is_dns_label(name) is label
    assert is_dns_name(name) is subdomain
