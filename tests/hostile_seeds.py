"""Seeds for the hostile-input suites: good keys, stub CSRs, public keys and proofs, odd keys
the API does not take, a certificate chain, key files and the blocks a bundle must refuse. The
mutators (`tests.strategies`) damage these where the parsers look; grafts come from every kind
(`DONORS`), so both suites, the signer's and the workload's, draw on one set. Keys are made
once, at import: RSA generation is slow."""

from __future__ import annotations

from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x25519

from podcert.api import keys
from tests.strategies import tree_of
from tests.unit.test_bundles_formats import WORKLOAD, Authority, key_secrets

GOOD_KEYS = {key_type: keys.generate(key_type) for key_type in keys.KEY_TYPES}
GOOD_CSRS = [keys.stub_csr(key) for key in GOOD_KEYS.values()]
GOOD_SPKIS = [keys.public_der(key) for key in GOOD_KEYS.values()]
ODD_KEYS: Final = [
    rsa.generate_private_key(65537, 2048),
    ec.generate_private_key(ec.SECP224R1()),
    ec.generate_private_key(ec.SECP256K1()),
    dsa.generate_private_key(2048),
    ed448.Ed448PrivateKey.generate(),
]


def csr(key: Any, algorithm: hashes.SHA256 | None) -> bytes:
    request = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
    return request.sign(key, algorithm).public_bytes(serialization.Encoding.DER)


def spki(key: Any) -> bytes:
    der: bytes = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def named_csr(key: Any) -> bytes:
    """A CSR with a subject and an extension request: more structure for the mutator."""
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, "web")]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("a.web.svc")]), critical=False)
    )
    return request.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)


ODD_CSRS: Final = [
    csr(ODD_KEYS[0], hashes.SHA256()),
    csr(ODD_KEYS[1], hashes.SHA256()),
    csr(ODD_KEYS[2], hashes.SHA256()),
    csr(ODD_KEYS[3], hashes.SHA256()),
    csr(ODD_KEYS[4], None),
    named_csr(GOOD_KEYS["ECDSAP256"]),
]
CSR_SEEDS: Final = GOOD_CSRS + ODD_CSRS
SPKI_SEEDS: Final = GOOD_SPKIS + [spki(key) for key in ODD_KEYS]
# v1beta1's proofs of possession, each good key's over BASE_REQUEST's pod UID.
GOOD_PROOFS: Final = [keys.sign_proof(key, "pod-uid-1") for key in GOOD_KEYS.values()]

# Certificates and keys for the bundle parsers: root -> intermediate -> leaf, and look-alikes.
ROOT = Authority("fuzz root")
INTERMEDIATE = ROOT.intermediate("fuzz intermediate")
OTHER_ROOT = Authority("fuzz other root")
LEAF_KEY = ec.generate_private_key(ec.SECP256R1())
LEAF = INTERMEDIATE.leaf(WORKLOAD, key=LEAF_KEY)
ED_KEY = GOOD_KEYS["ED25519"]
ED_LEAF = ROOT.leaf(WORKLOAD, "spiffe://cluster.local/ns/a/sa/b", key=ED_KEY)
NO_SAN_LEAF = ROOT.leaf(key=ec.generate_private_key(ec.SECP256R1()), san=False)


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def pkcs8(key: Any, encryption: Any = None) -> bytes:
    der: bytes = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        encryption or serialization.NoEncryption(),
    )
    return der


def traditional(key: Any) -> bytes:
    der: bytes = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )
    return der


CERT_SEEDS: Final = [der(c) for c in (LEAF, INTERMEDIATE.cert, ROOT.cert, ED_LEAF, NO_SAN_LEAF)]
KEY_SEEDS: Final = [
    pkcs8(LEAF_KEY),
    pkcs8(ED_KEY),
    pkcs8(GOOD_KEYS["RSA3072"]),
    pkcs8(ODD_KEYS[3]),  # DSA
    pkcs8(ODD_KEYS[4]),  # Ed448
    pkcs8(x25519.X25519PrivateKey.generate()),
]
# Blocks that are not what the bundle wants, each under its honest label.
FOREIGN_BLOCKS: Final = [
    (b"EC PRIVATE KEY", traditional(LEAF_KEY)),
    (b"RSA PRIVATE KEY", traditional(ODD_KEYS[0])),
    (
        b"ENCRYPTED PRIVATE KEY",
        pkcs8(LEAF_KEY, serialization.BestAvailableEncryption(b"pw")),
    ),
    (b"CERTIFICATE REQUEST", GOOD_CSRS[2]),
    (b"PUBLIC KEY", GOOD_SPKIS[2]),
    (b"X509 CRL", b"\x30\x03\x02\x01\x00"),
]
SECRETS: Final = frozenset(
    secret for key in (LEAF_KEY, ED_KEY, GOOD_KEYS["ECDSAP384"]) for secret in key_secrets(key)
)

# Grafts come from every kind of seed: an RSA SPKI in an EC CSR, a certificate in a key, ...
DONORS: Final = [*CSR_SEEDS, *SPKI_SEEDS, *CERT_SEEDS, *KEY_SEEDS, *(d for _, d in FOREIGN_BLOCKS)]
for _seed in DONORS:
    tree_of(_seed)  # every seed must round-trip; `TREES` then says which DER is a seed
