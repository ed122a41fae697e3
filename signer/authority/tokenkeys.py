"""The CA's key in a PKCS#11 token (python-pkcs11): generated inside it, used only through it.

`TokenKey` is a cryptography `EllipticCurvePrivateKey` whose `sign` asks the token: cryptography's
`CertificateBuilder.sign` calls the issuer key's `sign` with the TBS bytes, so certificates signed
with a `TokenKey` are built, encoded and signed by cryptography itself (no hand-made DER), and the
private key never leaves the token (CKA_SENSITIVE, not CKA_EXTRACTABLE: `private_bytes` and
`private_numbers` refuse). Only ECDSA P-256 over SHA-256 is made and used here.

Errors are of two kinds: `TokenConfigError` (wrong PIN, no such token or key, no module) stops
start-up with one line naming what is wrong; `TokenError` (the token refused or failed one
signature) is retryable and never carries key material.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any, Final

import pkcs11
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass, exceptions
from pkcs11.types import SignMixin
from pkcs11.util.ec import (
    encode_ec_public_key,
    encode_ecdsa_signature,
    encode_named_curve_parameters,
)

from signer import model
from signer.authority import ca, pkcs11uri
from signer.authority.pkcs11uri import KeyURI

DEFAULT_MODULE: Final = "/usr/lib/softhsm/libsofthsm2.so"
_CURVE_OID: Final = "secp256r1"


class TokenConfigError(Exception):
    """The token, its PIN or the key named by the URI cannot be used: start-up must stop."""


class TokenError(model.KeyUnavailable):
    """The token failed one operation (unreachable, refused); the caller retries."""


def read_pin(path: str | os.PathLike[str]) -> str:
    """The PIN in `path`, without its trailing newline; TokenConfigError names the file."""
    try:
        pin = Path(path).read_text().rstrip("\r\n")
    except OSError as exc:
        raise TokenConfigError(f"PIN file {path}: cannot be read ({exc.strerror})") from exc
    if not pin:
        raise TokenConfigError(f"PIN file {path}: empty")
    return pin


class TokenSession:
    """A logged-in session on the token a URI names; one lock serialises its operations, since a
    PKCS#11 session is not to be used by two threads at once."""

    def __init__(self, uri: KeyURI, pin: str, *, module_path: str | None = None) -> None:
        self.uri = uri
        self.lock = threading.Lock()
        module = module_path or uri.module_path or DEFAULT_MODULE
        try:
            lib = pkcs11.lib(module)
        except (RuntimeError, OSError) as exc:
            raise TokenConfigError(f"PKCS#11 module {module}: cannot be loaded") from exc
        query: dict[str, Any] = {"token_label": uri.token}
        if uri.serial is not None:
            query["token_serial"] = uri.serial.encode()
        try:
            token = lib.get_token(**query)
        except exceptions.NoSuchToken as exc:
            raise TokenConfigError(f"key URI: no token labelled {uri.token!r}") from exc
        except exceptions.MultipleTokensReturned as exc:
            raise TokenConfigError(f"key URI: several tokens labelled {uri.token!r}") from exc
        try:
            self._session = token.open(rw=True, user_pin=pin)
        except exceptions.UserAlreadyLoggedIn:
            # PKCS#11 logs in an application, not a session: this process already did.
            self._session = token.open(rw=True)
        except (exceptions.PinIncorrect, exceptions.PinLenRange) as exc:
            raise TokenConfigError(f"token {uri.token!r}: the PIN is wrong") from exc
        except exceptions.PKCS11Error as exc:
            raise TokenConfigError(f"token {uri.token!r}: cannot log in ({_name(exc)})") from exc

    def close(self) -> None:
        with self.lock:
            self._session.close()

    def _find(self) -> tuple[pkcs11.PublicKey, pkcs11.PrivateKey] | None:
        which: dict[str, Any] = {"key_type": KeyType.EC}
        if self.uri.object is not None:
            which["label"] = self.uri.object
        if self.uri.id is not None:
            which["id"] = self.uri.id
        try:
            private = self._session.get_key(object_class=ObjectClass.PRIVATE_KEY, **which)
            public = self._session.get_key(object_class=ObjectClass.PUBLIC_KEY, **which)
        except exceptions.NoSuchKey:
            return None
        except exceptions.MultipleObjectsReturned as exc:
            raise TokenConfigError(f"key URI: names several keys in {self.uri.token!r}") from exc
        if not isinstance(public, pkcs11.PublicKey) or not isinstance(private, pkcs11.PrivateKey):
            raise TokenConfigError(f"key URI: names no key pair in {self.uri.token!r}")
        return public, private

    def key(self) -> TokenKey:
        """The key the URI names; TokenConfigError when the token has none."""
        with self.lock:
            found = self._find()
        if found is None:
            raise TokenConfigError(f"key URI: token {self.uri.token!r} holds no such EC key")
        return TokenKey(self, *found)

    def generate(self) -> TokenKey:
        """A new P-256 key made inside the token under the URI's label/id: sensitive and not
        extractable. Refuses to shadow a key the URI already names."""
        with self.lock:
            if self._find() is not None:
                raise TokenConfigError(f"key URI: token {self.uri.token!r} already holds this key")
            params = self._session.create_domain_parameters(
                KeyType.EC,
                {Attribute.EC_PARAMS: encode_named_curve_parameters(_CURVE_OID)},
                local=True,
            )
            public, private = params.generate_keypair(
                store=True,
                label=self.uri.object,
                id=self.uri.id,
                private_template={
                    Attribute.SENSITIVE: True,
                    Attribute.EXTRACTABLE: False,
                    Attribute.SIGN: True,
                },
            )
        return TokenKey(self, public, private)

    def sign_ecdsa_sha256(self, private: pkcs11.PrivateKey, data: bytes) -> bytes:
        """The token's raw r||s over SHA-256(data); TokenError when the token fails. The digest is
        made here and signed with plain CKM_ECDSA, which every token has (SoftHSM 2.6 lacks
        CKM_ECDSA_SHA256); the key never leaves the token either way."""
        digest = hashes.Hash(hashes.SHA256())
        digest.update(data)
        if not isinstance(private, SignMixin):
            raise TokenError(f"token {self.uri.token!r}: the key cannot sign")
        try:
            with self.lock:
                raw = private.sign(digest.finalize(), mechanism=Mechanism.ECDSA)
        except exceptions.PKCS11Error as exc:
            raise TokenError(
                f"token {self.uri.token!r} refused a signature ({_name(exc)})"
            ) from exc
        return bytes(raw)


class TokenKey(ec.EllipticCurvePrivateKey):
    """A P-256 key held by a token: signs through it, never exports."""

    def __init__(
        self, session: TokenSession, public: pkcs11.PublicKey, private: pkcs11.PrivateKey
    ) -> None:
        self._session = session
        self._private = private
        loaded = serialization.load_der_public_key(encode_ec_public_key(public))
        if not isinstance(loaded, ec.EllipticCurvePublicKey):
            raise TokenConfigError("key URI: the token's key is not an EC key")
        self._public = loaded

    @property
    def key_uri(self) -> str:
        """The key's reference, as the CA Secret holds it instead of the key (`ca.KeyReference`)."""
        return pkcs11uri.key_reference(self._session.uri)

    @property
    def protected(self) -> bool:
        """The token says the key is sensitive and never was, nor is, extractable."""
        try:
            with self._session.lock:
                return bool(
                    self._private[Attribute.SENSITIVE]
                    and not self._private[Attribute.EXTRACTABLE]
                    and self._private[Attribute.NEVER_EXTRACTABLE]
                )
        except exceptions.PKCS11Error as exc:
            raise TokenError(f"token {self._session.uri.token!r}: {_name(exc)}") from exc

    def __repr__(self) -> str:
        return f"TokenKey(token={self._session.uri.token!r}, object={self._session.uri.object!r})"

    @property
    def curve(self) -> ec.EllipticCurve:
        return self._public.curve

    @property
    def key_size(self) -> int:
        return self._public.key_size

    def public_key(self) -> ec.EllipticCurvePublicKey:
        return self._public

    def sign(
        self,
        data: bytes | bytearray | memoryview,
        signature_algorithm: ec.EllipticCurveSignatureAlgorithm,
    ) -> bytes:
        algorithm = getattr(signature_algorithm, "algorithm", None)
        if isinstance(algorithm, utils.Prehashed) or not isinstance(algorithm, hashes.SHA256):
            raise TokenError("a token key signs ECDSA over SHA-256 of the data only")
        raw = self._session.sign_ecdsa_sha256(self._private, bytes(data))
        return encode_ecdsa_signature(raw)

    def exchange(self, algorithm: ec.ECDH, peer_public_key: ec.EllipticCurvePublicKey) -> bytes:
        raise TokenError("a token key signs only")

    def private_numbers(self) -> ec.EllipticCurvePrivateNumbers:
        raise TokenError("a token key is not extractable")

    def private_bytes(
        self,
        encoding: serialization.Encoding,
        format: serialization.PrivateFormat,
        encryption_algorithm: serialization.KeySerializationEncryption,
    ) -> bytes:
        raise TokenError("a token key is not extractable")

    def __copy__(self) -> TokenKey:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> TokenKey:
        return self


class TokenKeys:
    """The signer's keys in one token: a new one per CA generation, each labelled
    `<the URI's object>-<name>`, and those the CA Secret names found again. One logged-in
    session is shared (PKCS#11 logs a process in once)."""

    def __init__(self, uri: KeyURI, pin: str) -> None:
        self.uri = uri
        self._pin = pin
        self._session = TokenSession(uri, pin)  # the start-up check: the token and the PIN
        self._sessions: dict[KeyURI, TokenSession] = {}

    def _for(self, uri: KeyURI) -> TokenSession:
        found = self._sessions.get(uri)
        if found is None:
            found = self._sessions[uri] = TokenSession(uri, self._pin, module_path=self._module)
        return found

    @property
    def _module(self) -> str:
        return self.uri.module_path or DEFAULT_MODULE

    def new_key(self, name: str) -> TokenKey:
        """A key made in the token for the CA generation `name`."""
        label = f"{self.uri.object or 'podcert'}-{name}"
        return self._for(dataclasses.replace(self.uri, object=label, id=None)).generate()

    def resolve(self, reference: str) -> TokenKey:
        """The key a CA Secret's URI names, in this signer's token; ca.CAError when it cannot be
        used (another token, no such key)."""
        try:
            uri = pkcs11uri.parse(reference)
        except pkcs11uri.URIError as exc:
            raise ca.CAError(f"{ca.TLS_KEY_URI}: {exc}") from None
        if uri.token != self.uri.token:
            raise ca.CAError(
                f"{ca.TLS_KEY_URI}: names token {uri.token!r}, but the signer's is "
                f"{self.uri.token!r} (--ca-key-uri)"
            )
        mine = dataclasses.replace(self.uri, object=uri.object, id=uri.id)
        try:
            return self._for(mine).key()
        except TokenConfigError as exc:
            raise ca.CAError(f"{ca.TLS_KEY_URI}: {exc}") from None


def _name(exc: BaseException) -> str:
    """The PKCS#11 error's class name: its message may quote attributes, never key material,
    but the name is all an operator needs."""
    return type(exc).__name__
