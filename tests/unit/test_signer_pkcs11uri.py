"""RFC 7512 key URIs: what names one key is accepted, anything else is refused by name."""

from __future__ import annotations

import pytest

from signer.authority import pkcs11uri
from signer.authority.pkcs11uri import KeyURI, URIError


def test_a_full_uri_names_token_label_id_module_and_pin_file() -> None:
    uri = pkcs11uri.parse(
        "pkcs11:token=podcert%20ca;object=intermediate;id=%01%02;type=private"
        "?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/run/pin"
    )
    assert uri == KeyURI(
        token="podcert ca",
        object="intermediate",
        id=b"\x01\x02",
        module_path="/usr/lib/softhsm/libsofthsm2.so",
        pin_source="file:/run/pin",
    )
    assert uri.pin_file() == "/run/pin"


@pytest.mark.parametrize(
    ("source", "path"),
    [("file:///run/pin", "/run/pin"), ("/etc/pin", "/etc/pin"), (None, None)],
)
def test_the_pin_source_is_a_file_uri_or_a_plain_path(source: str | None, path: str | None) -> None:
    assert KeyURI(token="t", object="k", pin_source=source).pin_file() == path


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("https://token=a;object=b", "pkcs11:"),
        ("pkcs11:object=b", "token="),
        ("pkcs11:token=a", "object="),
        ("pkcs11:token=a;object=b?pin-value=1234", "pin-value"),
        ("pkcs11:token=a;object=b;slot-id=3", "slot-id"),
        ("pkcs11:token=a;object=b?module-name=softhsm2", "module-name"),
        ("pkcs11:token=a;object=b;type=cert", "type=cert"),
        ("pkcs11:token=a;token=b;object=c", "token is given twice"),
        ("pkcs11:token;object=c", "'token' has no value"),
    ],
)
def test_an_unusable_uri_is_refused_naming_the_attribute(uri: str, named: str) -> None:
    with pytest.raises(URIError, match=named.replace("?", r"\?")):
        pkcs11uri.parse(uri)
