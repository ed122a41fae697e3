"""Subject keys made on the node, and the empty stub PKCS#10 request that proves possession.

Pure: no I/O, no clock. The private key object never leaves this process except as the PKCS#8
block written into the pod's own credential files.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

KeyType = Literal["RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"]
KEY_TYPES: Final[tuple[KeyType, ...]] = get_args(KeyType)

PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey

_CURVES: Final[dict[str, ec.EllipticCurve]] = {
    "ECDSAP256": ec.SECP256R1(),
    "ECDSAP384": ec.SECP384R1(),
    "ECDSAP521": ec.SECP521R1(),
}


def generate(key_type: KeyType) -> PrivateKey:
    if key_type in _CURVES:
        return ec.generate_private_key(_CURVES[key_type])
    if key_type == "RSA3072":
        return rsa.generate_private_key(public_exponent=65537, key_size=3072)
    if key_type == "RSA4096":
        return rsa.generate_private_key(public_exponent=65537, key_size=4096)
    if key_type == "ED25519":
        return ed25519.Ed25519PrivateKey.generate()
    raise ValueError(f"keyType: unsupported key type {key_type!r}; one of {', '.join(KEY_TYPES)}")


def stub_csr(key: PrivateKey) -> bytes:
    """DER of an empty-subject PKCS#10 request signed by `key` (what the kubelet sends)."""
    algorithm: hashes.HashAlgorithm | None
    if isinstance(key, ed25519.Ed25519PrivateKey):
        algorithm = None
    elif isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size > 256:
        algorithm = hashes.SHA384() if key.curve.key_size == 384 else hashes.SHA512()
    else:
        algorithm = hashes.SHA256()
    csr = x509.CertificateSigningRequestBuilder().subject_name(x509.Name([])).sign(key, algorithm)
    return csr.public_bytes(serialization.Encoding.DER)


def pkcs8_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_der(key: PrivateKey) -> bytes:
    """SubjectPublicKeyInfo DER: how keys are compared with a certificate's."""
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
