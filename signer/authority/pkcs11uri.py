"""RFC 7512 `pkcs11:` URIs naming the CA's key in a token: parsed here, nothing opened.

Only what names one key and reaches it is accepted: the path attributes `token`, `object`,
`id`, `type` (must be `private`), `manufacturer`, `serial`, `model`, and the query attributes
`module-path` and `pin-source` (a file path, or a `file:` URI, as RFC 7512 section 2.3 allows).
A `pin-value` in the URI is refused: the PIN would then travel in flags, logs and Secrets.
Anything else is an error naming the attribute, never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, unquote, unquote_to_bytes

SCHEME: Final = "pkcs11:"
_PATH_TEXT: Final = frozenset({"token", "object", "manufacturer", "serial", "model", "type"})


class URIError(ValueError):
    """The URI cannot name a key; the message names the attribute at fault."""


@dataclass(frozen=True)
class KeyURI:
    """One key in one token; `object` (label) and `id` are how the key is found."""

    token: str
    object: str | None = None
    id: bytes | None = None
    manufacturer: str | None = None
    serial: str | None = None
    model: str | None = None
    module_path: str | None = None
    pin_source: str | None = None

    def pin_file(self) -> str | None:
        """The PIN file `pin-source` names (a `file:` URI or a plain path), if any."""
        if self.pin_source is None:
            return None
        return self.pin_source.removeprefix("file://").removeprefix("file:")


def key_reference(uri: KeyURI) -> str:
    """The URI of `uri`'s key alone, as the CA Secret stores it: the token and the key's label or
    id, never the module path or the PIN's source (those are the signer's configuration)."""
    parts = [f"token={quote(uri.token, safe='')}"]
    if uri.object is not None:
        parts.append(f"object={quote(uri.object, safe='')}")
    if uri.id is not None:
        parts.append("id=" + "".join(f"%{b:02X}" for b in uri.id))
    return SCHEME + ";".join([*parts, "type=private"])


def parse(uri: str) -> KeyURI:
    """Parse `uri`; raises URIError naming the attribute for anything it cannot use."""
    if not uri.startswith(SCHEME):
        raise URIError(f"key URI: must start with {SCHEME!r}")
    path, _, query = uri[len(SCHEME) :].partition("?")
    attrs: dict[str, str] = {}
    key_id: bytes | None = None
    for part in filter(None, path.split(";")):
        name, eq, value = part.partition("=")
        if not eq:
            raise URIError(f"key URI: path attribute {name!r} has no value")
        if name in attrs or (name == "id" and key_id is not None):
            raise URIError(f"key URI: {name} is given twice")
        if name == "id":
            key_id = unquote_to_bytes(value)
        elif name in _PATH_TEXT:
            attrs[name] = unquote(value, errors="strict")
        else:
            raise URIError(f"key URI: path attribute {name!r} is not supported")
    for part in filter(None, query.split("&")):
        name, eq, value = part.partition("=")
        if not eq:
            raise URIError(f"key URI: query attribute {name!r} has no value")
        if name == "pin-value":
            raise URIError("key URI: pin-value is refused; give the PIN in a file (pin-source)")
        if name not in ("module-path", "pin-source"):
            raise URIError(f"key URI: query attribute {name!r} is not supported")
        if name in attrs:
            raise URIError(f"key URI: {name} is given twice")
        attrs[name] = unquote(value, errors="strict")
    if attrs.get("type", "private") != "private":
        raise URIError(f"key URI: type={attrs['type']} names no private key; use type=private")
    if not attrs.get("token"):
        raise URIError("key URI: token= (the token's label) is required")
    if not attrs.get("object") and not key_id:
        raise URIError("key URI: object= (the key's label) or id= is required")
    return KeyURI(
        token=attrs["token"],
        object=attrs.get("object"),
        id=key_id,
        manufacturer=attrs.get("manufacturer"),
        serial=attrs.get("serial"),
        model=attrs.get("model"),
        module_path=attrs.get("module-path"),
        pin_source=attrs.get("pin-source"),
    )
