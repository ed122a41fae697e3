"""The CA Secret held in memory, for the unit tests of what reads and writes it (`CAStore`, the
process wiring, the formats kept across releases): the three calls `CAStore` makes of the API,
with the Secret's resourceVersion checked on every replace and the writes counted, and the watch
event that brings a Secret's new version. `HeldKeys` stands for a PKCS#11 token (its keys sign
and name themselves by URI, never export) where the token itself is not the point."""

from __future__ import annotations

import base64
from collections.abc import Mapping

from cryptography.hazmat.primitives.asymmetric import ec

from signer.authority import ca


class SecretKube:
    """The three calls CAStore makes of the API, on one Secret in memory; counts the writes."""

    def __init__(self, data: Mapping[str, bytes] | None) -> None:
        self.data = dict(data) if data is not None else None
        self.version = 1
        self.writes = 0

    def read_secret(self, namespace: str, name: str) -> tuple[dict[str, bytes], str] | None:
        return None if self.data is None else (dict(self.data), str(self.version))

    def create_secret(
        self, namespace: str, name: str, data: Mapping[str, bytes], labels: Mapping[str, str]
    ) -> bool:
        self.writes += 1
        self.data = dict(data)
        return True

    def replace_secret(
        self,
        namespace: str,
        name: str,
        data: Mapping[str, bytes],
        resource_version: str,
        labels: Mapping[str, str],
    ) -> str:
        assert resource_version == str(self.version)
        self.writes += 1
        self.data, self.version = dict(data), self.version + 1
        return str(self.version)


def secret_event(data: Mapping[str, bytes], version: str) -> dict[str, object]:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {"metadata": {"resourceVersion": version}, "data": encoded}


class Held(ec.EllipticCurvePrivateKey):
    """A key held "elsewhere" (as a token's is): signs, names itself by URI, never exports."""

    def __init__(self, uri: str) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self.key_uri = uri

    @property
    def curve(self) -> ec.EllipticCurve:
        return self._key.curve

    @property
    def key_size(self) -> int:
        return self._key.key_size

    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._key.public_key()

    def sign(self, data: object, signature_algorithm: ec.EllipticCurveSignatureAlgorithm) -> bytes:
        return self._key.sign(data, signature_algorithm)  # type: ignore[arg-type]

    def exchange(self, algorithm: ec.ECDH, peer_public_key: ec.EllipticCurvePublicKey) -> bytes:
        raise NotImplementedError

    def private_numbers(self) -> ec.EllipticCurvePrivateNumbers:
        raise NotImplementedError("not extractable")

    def private_bytes(self, *args: object) -> bytes:
        raise NotImplementedError("not extractable")

    def __copy__(self) -> Held:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Held:
        return self


class HeldKeys:
    """A `castore.KeySource` of `Held` keys: made by name, found again by their URI."""

    def __init__(self) -> None:
        self.made: dict[str, Held] = {}

    def new_key(self, name: str) -> ca.CAKey:
        key = self.made[f"pkcs11:token=t;object=ca-{name}"] = Held(
            f"pkcs11:token=t;object=ca-{name}"
        )
        return key

    def resolve(self, reference: str, field: str) -> ca.CAKey:
        if reference not in self.made:
            raise ca.CAError(f"{field}: no such key")
        return self.made[reference]
