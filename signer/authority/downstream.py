"""SPIRE as the upstream: when to ask it for a new intermediate, what of its answer to accept,
and how long to wait after it failed to answer.

The signer is registered in SPIRE as a downstream workload and asks the SPIRE server for its
intermediate (`svid.v1.SVID/NewDownstreamX509CA`, `signer.authority.spireupstream`); each answer
becomes a CA generation like an offline import (`signer.authority.offline`), so the CA schedule
activates, retires and removes it as any other. Guaranteed here:

- `renew_at`: an intermediate is renewed once it has used `fraction` of its life, and never
  later than its end minus the longest leaf lifetime and the overlap (the new one must have been
  published for the overlap before it signs, and every leaf signed until then must fit inside
  the old one);
- `renewal_due`: renewal is asked for while nothing is prepared and the active intermediate is
  past `renew_at`, is not SPIRE's (podcert's own root, or none), or an operator asked for it
  after it became active (`podcert signer ca prepare --upstream spire`);
- `check_answer`: SPIRE's chain is accepted only if the offline import's checks pass on it
  (our key, a CA with keyCertSign, the trust domain, valid for the longest leaf plus the
  overlap) with the root that signed it found among the X.509 authorities it sent;
- `retry_delay`: failed attempts back off exponentially from `retry_min` to `retry_max`.

The trust bundles hold SPIRE's X.509 authorities as SPIRE last published them (its active,
prepared and old CAs while it rotates) besides every root our generations chain to, so pods
trust SPIRE workloads signed by SPIRE's next CA before our own intermediate moves under it.
Pure: times are arguments, nothing here reads the clock, the disk or the network.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from bundles.formats import signed_by
from podcert.api import keys
from podcert.api.times import format_time, parse_time
from signer.authority import ca, offline, revoke, schedule

# CA Secret keys (outside the generations' index; the CA store carries them over every step).
PREFIX: Final = "spire."
AUTHORITIES_KEY: Final = "spire.x509-authorities.pem"  # SPIRE's X.509 authorities, last seen
RENEW_REQUEST_KEY: Final = "spire.renew-requested"  # when an operator asked for a renewal


class UpstreamUnavailable(Exception):
    """SPIRE (agent or server) did not answer, or refused: retried with backoff, never fatal.
    The message names the endpoint and what failed, never key material."""


@dataclass(frozen=True)
class Endpoints:
    """Where SPIRE is: the agent's Workload API socket, the server's API (host:port), and
    how long one call may take (seconds)."""

    agent_socket: str
    server: str
    timeout: float = 10.0
    interval: float = 30.0  # seconds between looks at SPIRE's bundle and the renewal point


@dataclass(frozen=True)
class RenewalSettings:
    """When the SPIRE-signed intermediate is renewed and how failures are retried."""

    fraction: float = 0.5
    max_leaf_lifetime: dt.timedelta = schedule.DEFAULT_SETTINGS.max_leaf_lifetime
    overlap: dt.timedelta = schedule.DEFAULT_SETTINGS.overlap
    retry_min: dt.timedelta = dt.timedelta(seconds=5)
    retry_max: dt.timedelta = dt.timedelta(minutes=5)

    @property
    def must_cover(self) -> dt.timedelta:
        """How long from issue an intermediate must last to be accepted."""
        return self.max_leaf_lifetime + self.overlap


@dataclass(frozen=True)
class Answer:
    """A checked NewDownstreamX509CA answer: the chain as a generation takes it, and SPIRE's
    X.509 authorities (its trust bundle's roots)."""

    chain: offline.SignedChain
    authorities: tuple[x509.Certificate, ...]


def renew_at(intermediate: x509.Certificate, settings: RenewalSettings) -> dt.datetime:
    """When `intermediate` is renewed: at `fraction` of its life, but no later than its end
    minus the longest leaf and the overlap (and never before it starts)."""
    start, end = intermediate.not_valid_before_utc, intermediate.not_valid_after_utc
    by_share = start + (end - start) * settings.fraction
    return max(start, min(by_share, end - settings.must_cover))


def renew_by(intermediate: x509.Certificate, settings: RenewalSettings) -> dt.datetime:
    """The last moment a renewal keeps every leaf at its full lifetime: later, the new
    intermediate cannot have had the overlap before leaves would be cut short."""
    return intermediate.not_valid_after_utc - settings.must_cover


def is_spire_signed(gen: schedule.Generation, authorities: Sequence[x509.Certificate]) -> bool:
    """A generation whose root is one of SPIRE's authorities and whose root key we lack."""
    ders = {_der(a) for a in authorities}
    return gen.bundle.root_key is None and _der(gen.root) in ders


def renewal_due(
    generations: Sequence[schedule.Generation],
    authorities: Sequence[x509.Certificate],
    requested: dt.datetime | None,
    now: dt.datetime,
    settings: RenewalSettings,
) -> str | None:
    """Why a new intermediate should be asked of SPIRE now, or None."""
    if any(g.id == "operator" for g in generations):
        return None  # an operator's own CA Secret: never replaced by the signer
    if any(g.state == "prepared" for g in generations):
        return None  # the schedule activates it; one new generation at a time
    current = schedule.active(generations)
    if current is None:
        return "no CA signs"
    if not is_spire_signed(current, authorities):
        return f"the active CA {current.id} is not signed by SPIRE"
    if requested is not None and requested > current.since:
        return f"renewal requested at {format_time(requested)}"
    when = renew_at(current.bundle.intermediate, settings)
    if now >= when:
        return f"{current.id} reached its renewal point {format_time(when)}"
    return None


def retry_delay(failures: int, settings: RenewalSettings, jitter: float) -> dt.timedelta:
    """The wait after `failures` failed attempts in a row (>= 1): doubling from retry_min up to
    retry_max, less up to a fifth by `jitter` in [0, 1) so replicas and restarts spread out."""
    if failures < 1:
        return dt.timedelta(0)
    base = min(settings.retry_max, settings.retry_min * (1 << min(failures - 1, 30)))
    return base * (1 - 0.2 * min(max(jitter, 0.0), 1.0))


def split_ders(blob: bytes) -> list[bytes]:
    """The DER values of a concatenation (the Workload API's x509_svid and bundle fields);
    ValueError when the blob is not whole DER SEQUENCEs."""
    out, at = [], 0
    while at < len(blob):
        if blob[at] != 0x30 or at + 2 > len(blob):
            raise ValueError(f"byte {at}: not the start of a DER SEQUENCE")
        first = blob[at + 1]
        if first < 0x80:
            length, header = first, 2
        else:
            width = first & 0x7F
            if not 1 <= width <= 4 or at + 2 + width > len(blob):
                raise ValueError(f"byte {at}: a DER length of {width} bytes")
            length = int.from_bytes(blob[at + 2 : at + 2 + width], "big")
            header = 2 + width
        end = at + header + length
        if end > len(blob):
            raise ValueError(f"byte {at}: a DER value runs past the end")
        out.append(blob[at:end])
        at = end
    return out


def parse_ders(items: Sequence[bytes], field: str) -> list[x509.Certificate]:
    """DER certificates of an answer's repeated field; ChainError naming `field[N]`."""
    out = []
    for n, der in enumerate(items):
        try:
            out.append(x509.load_der_x509_certificate(der))
        except ValueError as exc:
            raise offline.ChainError(f"{field}[{n}]: not a DER certificate ({exc})") from None
    return out


def check_answer(
    ca_cert_chain: Sequence[bytes],
    x509_authorities: Sequence[bytes],
    key: keys.PrivateKey,
    trust_domain: str,
    now: dt.datetime,
    settings: RenewalSettings,
) -> Answer:
    """SPIRE's answer checked as an offline import is, with the authority that signed the
    chain's last certificate appended as its root; ChainError naming the field otherwise."""
    chain = parse_ders(ca_cert_chain, "ca_cert_chain")
    authorities = parse_ders(x509_authorities, "x509_authorities")
    if not chain:
        raise offline.ChainError("ca_cert_chain: empty (SPIRE signed no CA)")
    if not authorities:
        raise offline.ChainError("x509_authorities: empty (SPIRE sent no trust bundle)")
    top = chain[-1]
    root = next((a for a in authorities if signed_by(top, a)), None)
    if root is None:
        raise offline.ChainError(
            f"ca_cert_chain[{len(chain) - 1}]: signed by none of the {len(authorities)} "
            "x509_authorities SPIRE sent"
        )
    links = chain if _der(top) == _der(root) else [*chain, root]
    signed = offline.check_signed_chain(links, key, trust_domain, now, settings.must_cover)
    return Answer(signed, tuple(authorities))


def bundle_of(answer: Answer, key: keys.PrivateKey) -> ca.CABundle:
    """The generation an answer makes: SPIRE's root, its intermediates, our key, no root key."""
    chain = answer.chain
    return ca.CABundle(
        root=chain.root,
        intermediate=chain.intermediate,
        intermediate_key=key,
        root_key=None,
        upstream=chain.upstream,
    )


def merged_roots(
    own: Sequence[x509.Certificate], authorities: Sequence[x509.Certificate]
) -> list[x509.Certificate]:
    """What the trust bundles hold: our generations' roots, then SPIRE's other authorities;
    each once."""
    seen: set[bytes] = set()
    out = []
    for cert in (*own, *authorities):
        der = _der(cert)
        if der not in seen:
            seen.add(der)
            out.append(cert)
    return out


def same_set(a: Sequence[x509.Certificate], b: Sequence[x509.Certificate]) -> bool:
    return {_der(c) for c in a} == {_der(c) for c in b}


def next_step(
    secret: Mapping[str, bytes],
    gens: Sequence[schedule.Generation],
    now: dt.datetime,
    settings: schedule.Settings,
) -> str | None:
    """The CA's next step in words (`podcert status`): SPIRE's renewal when SPIRE signs (its
    authorities are in the Secret), else what `offline.next_step` says."""
    current = schedule.active(gens)
    spire = current is not None and is_spire_signed(current, authorities_from_secret(secret))
    if spire and isinstance(schedule.ca_schedule(gens, now, settings), schedule.Prepare):
        return "SPIRE signs the next intermediate (`ca prepare --upstream spire` to ask now)"
    return offline.next_step(secret, gens, now, settings)


# --- the Secret's part ---------------------------------------------------------------------------


def authorities_from_secret(data: Mapping[str, bytes]) -> list[x509.Certificate]:
    """SPIRE's authorities as last stored; none when absent. CAError naming the key if
    unreadable."""
    raw = data.get(AUTHORITIES_KEY)
    if not raw:
        return []
    try:
        return x509.load_pem_x509_certificates(raw)
    except ValueError:
        raise ca.CAError(f"{AUTHORITIES_KEY}: not PEM certificates") from None


def authorities_to_secret(authorities: Sequence[x509.Certificate]) -> dict[str, bytes]:
    pem = b"".join(a.public_bytes(serialization.Encoding.PEM) for a in authorities)
    return {AUTHORITIES_KEY: pem}


def requested_from_secret(data: Mapping[str, bytes]) -> dt.datetime | None:
    """When an operator last asked for a renewal; None when never (or unreadable: a request
    that cannot be read is no request, and the schedule still renews in time)."""
    raw = data.get(RENEW_REQUEST_KEY)
    return parse_time(raw.decode("ascii", "replace")) if raw else None


def request_to_secret(now: dt.datetime) -> dict[str, bytes]:
    return {RENEW_REQUEST_KEY: format_time(now).encode()}


def carried_over(data: Mapping[str, bytes]) -> dict[str, bytes]:
    """The SPIRE upstream's keys of a Secret, to keep through a rotation step."""
    return {k: v for k, v in data.items() if k.startswith(PREFIX)}


def _der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


# A change to the CA Secret: (data, generations, now, settings) -> (new data, new generations).
Change = Callable[
    [Mapping[str, bytes], list[schedule.Generation], dt.datetime, schedule.Settings],
    tuple[dict[str, bytes], list[schedule.Generation]],
]


def with_authorities(authorities: Sequence[x509.Certificate]) -> Change:
    """The Secret holding SPIRE's X.509 authorities as SPIRE now publishes them."""

    def change(
        data: Mapping[str, bytes],
        gens: list[schedule.Generation],
        now: dt.datetime,
        settings: schedule.Settings,
    ) -> tuple[dict[str, bytes], list[schedule.Generation]]:
        return {**data, **authorities_to_secret(authorities)}, gens

    return change


def with_request() -> Change:
    """The Secret asking the leader for a new intermediate from SPIRE now."""

    def change(
        data: Mapping[str, bytes],
        gens: list[schedule.Generation],
        now: dt.datetime,
        settings: schedule.Settings,
    ) -> tuple[dict[str, bytes], list[schedule.Generation]]:
        return {**data, **request_to_secret(now)}, gens

    return change


def with_generation(bundle: ca.CABundle, authorities: Sequence[x509.Certificate]) -> Change:
    """The Secret with an intermediate SPIRE signed as the prepared generation (active when
    nothing signs yet; its id ends in `-spire`), and SPIRE's authorities; revocations, an
    offline generation awaiting its chain and the request are kept."""

    def change(
        data: Mapping[str, bytes],
        gens: list[schedule.Generation],
        now: dt.datetime,
        settings: schedule.Settings,
    ) -> tuple[dict[str, bytes], list[schedule.Generation]]:
        after = schedule.apply(gens, schedule.Prepare(), now, settings, bundle)
        after = [replace(g, id=f"{g.id}-spire") if g.bundle is bundle else g for g in after]
        written = schedule.to_secret(after)
        written.update(revoke.to_secret(revoke.from_secret(data)))
        written.update(offline.carried_over(data))
        written.update(carried_over(data))
        written.update(authorities_to_secret(authorities))
        return written, after

    return change
