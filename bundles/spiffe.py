"""SPIFFE IDs: parsing them strictly, and reading the one a certificate carries.

Peers are authorized by SPIFFE ID, not by hostname, so a malformed ID must never slip through as
"close enough". Every malformed case has its own error class (py-spiffe style), so callers can log
a precise reason and tests can pin each case. Pure: no I/O, no clock.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Final, NamedTuple

from cryptography import x509

SCHEME_PREFIX: Final = "spiffe://"
MAX_ID_LENGTH: Final = 2048  # bytes, SPIFFE-ID spec section 2.3
MAX_TRUST_DOMAIN_LENGTH: Final = 255  # a DNS name at most

_TRUST_DOMAIN_CHARS: Final = frozenset(string.ascii_lowercase + string.digits + ".-_")
_PATH_SEGMENT_CHARS: Final = frozenset(string.ascii_letters + string.digits + ".-_")


class SpiffeIdError(ValueError):
    """A string is not a valid SPIFFE ID. Subclasses name the exact defect."""


class NotSpiffeSchemeError(SpiffeIdError):
    pass


class InvalidTrustDomainError(SpiffeIdError):
    pass


class ForbiddenUriPartError(SpiffeIdError):
    """A port, userinfo, query or fragment: none is allowed in a SPIFFE ID."""


class InvalidPathError(SpiffeIdError):
    pass


class TooLongError(SpiffeIdError):
    pass


class CertificateIdError(ValueError):
    """A certificate does not carry exactly one valid SPIFFE ID. Subclasses name the defect."""


class NoSanExtensionError(CertificateIdError):
    pass


class NoUriSanError(CertificateIdError):
    pass


class SeveralUriSansError(CertificateIdError):
    pass


class NotSpiffeUriError(CertificateIdError):
    """The single URI SAN is not a valid SPIFFE ID; `__cause__` is the SpiffeIdError."""


class MalformedSanError(CertificateIdError):
    """The SAN extension itself cannot be decoded (or appears twice)."""


def parse_trust_domain(name: str) -> str:
    """Validate a trust domain name; accepts `example.org` or `spiffe://example.org`."""
    if name.startswith(SCHEME_PREFIX):
        spiffe_id = SpiffeId.parse(name)
        if spiffe_id.path:
            raise InvalidTrustDomainError(f"{name!r} is a workload ID, not a trust domain")
        return spiffe_id.trust_domain
    _check_trust_domain(name, shown=name)
    return name


def _check_trust_domain(td: str, *, shown: str) -> None:
    if not td:
        raise InvalidTrustDomainError(f"{shown!r} has an empty trust domain")
    if len(td) > MAX_TRUST_DOMAIN_LENGTH:
        raise InvalidTrustDomainError(
            f"trust domain is {len(td)} characters long; at most {MAX_TRUST_DOMAIN_LENGTH}"
        )
    bad = sorted(set(td) - _TRUST_DOMAIN_CHARS)
    if bad:
        raise InvalidTrustDomainError(
            f"trust domain {td!r} holds {''.join(bad)!r}; only lowercase letters, digits, "
            "'.', '-' and '_' are allowed"
        )


@dataclass(frozen=True, order=True)
class SpiffeId:
    """`spiffe://<trust_domain><path>`; path is "" (the trust domain itself) or `/seg/seg...`."""

    trust_domain: str
    path: str = ""

    def __post_init__(self) -> None:
        # Constructing directly must give the same guarantees as parse().
        shown = SCHEME_PREFIX + self.trust_domain + self.path
        if len(shown.encode("utf-8", "surrogatepass")) > MAX_ID_LENGTH:
            raise TooLongError(f"SPIFFE ID is longer than {MAX_ID_LENGTH} bytes")
        _check_trust_domain(self.trust_domain, shown=shown)
        if self.path and not self.path.startswith("/"):
            raise InvalidPathError(f"path {self.path!r} must be empty or start with '/'")
        if self.path:
            _check_path(self.path, shown=shown)

    @classmethod
    def parse(cls, uri: str) -> SpiffeId:
        """Parse strictly per the SPIFFE-ID spec; raises a SpiffeIdError subclass."""
        # len() first so a huge string is refused before it is copied by encode().
        if len(uri) > MAX_ID_LENGTH or len(uri.encode("utf-8", "surrogatepass")) > MAX_ID_LENGTH:
            raise TooLongError(f"SPIFFE ID is longer than {MAX_ID_LENGTH} bytes")
        if not uri.startswith(SCHEME_PREFIX):
            # Quote only the head: the input may be hostile or huge.
            raise NotSpiffeSchemeError(f"{uri[:64]!r} does not start with {SCHEME_PREFIX!r}")
        rest = uri[len(SCHEME_PREFIX) :]
        # Query and fragment are checked first: '?' and '#' end the authority and the path alike.
        if "?" in rest:
            raise ForbiddenUriPartError(f"{uri!r} has a query; SPIFFE IDs have none")
        if "#" in rest:
            raise ForbiddenUriPartError(f"{uri!r} has a fragment; SPIFFE IDs have none")
        authority, slash, path = rest.partition("/")
        if "@" in authority:
            raise ForbiddenUriPartError(f"{uri!r} has userinfo; SPIFFE IDs have none")
        if ":" in authority:
            raise ForbiddenUriPartError(f"{uri!r} has a port; SPIFFE IDs have none")
        _check_trust_domain(authority, shown=uri)
        if slash:
            _check_path("/" + path, shown=uri)
            path = "/" + path
        # object.__new__ + object.__setattr__ skips __post_init__, which would parse again.
        spiffe_id = object.__new__(cls)
        object.__setattr__(spiffe_id, "trust_domain", authority)
        object.__setattr__(spiffe_id, "path", path)
        return spiffe_id

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split("/")[1:]) if self.path else ()

    def member_of(self, trust_domain: str) -> bool:
        return self.trust_domain == trust_domain

    def __str__(self) -> str:
        return SCHEME_PREFIX + self.trust_domain + self.path


def _check_path(path: str, *, shown: str) -> None:
    # path starts with "/": every segment after it must be non-empty, not a dot segment, and
    # drawn from the unreserved set (so no percent-encoding sneaks in an alternative spelling).
    for segment in path.split("/")[1:]:
        if not segment:
            raise InvalidPathError(f"{shown!r} has an empty path segment (or a trailing '/')")
        if segment in (".", ".."):
            raise InvalidPathError(f"{shown!r} has a {segment!r} path segment")
        bad = sorted(set(segment) - _PATH_SEGMENT_CHARS)
        if bad:
            raise InvalidPathError(
                f"{shown!r} path holds {''.join(bad)!r}; only letters, digits, '.', '-' and '_' "
                "are allowed"
            )


def spiffe_id_of(cert: x509.Certificate) -> SpiffeId:
    """The SPIFFE ID of an X.509-SVID: its one and only URI SAN. Raises CertificateIdError."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise NoSanExtensionError("certificate has no subjectAltName extension") from None
    except (x509.DuplicateExtension, x509.UnsupportedGeneralNameType, ValueError) as exc:
        raise MalformedSanError(f"certificate extensions cannot be decoded: {exc}") from exc
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    if not uris:
        raise NoUriSanError("certificate has no URI subjectAltName")
    if len(uris) > 1:
        raise SeveralUriSansError(
            f"certificate has {len(uris)} URI subjectAltNames; an SVID has exactly one"
        )
    try:
        return SpiffeId.parse(uris[0])
    except SpiffeIdError as exc:
        raise NotSpiffeUriError(f"certificate URI SAN is not a SPIFFE ID: {exc}") from exc


class Workload(NamedTuple):
    namespace: str
    service_account: str


def workload_of(spiffe_id: SpiffeId) -> Workload | None:
    """(namespace, service account) for the `/ns/<ns>/sa/<sa>` shape, else None."""
    segments = spiffe_id.segments
    if len(segments) == 4 and segments[0] == "ns" and segments[2] == "sa":
        return Workload(segments[1], segments[3])
    return None
