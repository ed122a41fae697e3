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

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Final

import pkcs11
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from pkcs11 import Attribute, KeyType, Mechanism, ObjectClass, exceptions
from pkcs11.types import SignMixin
from pkcs11.util.ec import encode_ec_public_key, encode_named_curve_parameters

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


# Seconds between two re-initialisations of one module while its token stays away.
REINITIALIZE_EVERY: Final = 1.0


class _Library:
    """One loaded PKCS#11 module, shared by every session of this process on it. A token that
    went away and came back is seen only after the module is initialised again (SoftHSM2, and
    many vendors' libraries, read their slots at C_Initialize): `generation` counts those
    re-initialisations, so each session knows its handles died with the last one.

    One lock serialises every call of this process into the module: a PKCS#11 session is not
    for two threads at once, and C_Finalize must never run beside another call. It costs
    nothing the signer would use: only the active intermediate's key signs often."""

    _loaded: ClassVar[dict[str, _Library]] = {}
    _loading: ClassVar = threading.Lock()

    def __init__(self, module: str, clock: Callable[[], float]) -> None:
        try:
            self.lib = pkcs11.lib(module)
        except (RuntimeError, OSError) as exc:
            raise TokenConfigError(f"PKCS#11 module {module}: cannot be loaded") from exc
        self.generation = 0
        self._clock = clock
        self._last = -REINITIALIZE_EVERY
        self.lock = threading.RLock()

    @classmethod
    def load(cls, module: str, clock: Callable[[], float] = time.monotonic) -> _Library:
        with cls._loading:
            found = cls._loaded.get(module)
            if found is None:
                found = cls._loaded[module] = cls(module, clock)
            return found

    def reinitialize(self, seen: int) -> None:
        """Initialise the module again, unless another session did since `seen` or one did
        less than REINITIALIZE_EVERY ago (a token away for minutes is not hammered)."""
        with self.lock:
            if self.generation != seen or self._clock() - self._last < REINITIALIZE_EVERY:
                return
            self._last = self._clock()
            self.generation += 1
            # The next attempt finds the token, or not, and says so.
            with contextlib.suppress(exceptions.PKCS11Error):
                self.lib.reinitialize()


class TokenSession:
    """A logged-in session on the token a URI names, for the one key the URI names; its
    operations hold the module's lock (`_Library`).

    A signature the token fails marks the session broken: the next one opens a new session
    (logging in again when the token asks) and finds the key again by its label or id, so a
    token that was unreachable, restarted or logged out signs again once it is back."""

    def __init__(self, uri: KeyURI, pin: str, *, module_path: str | None = None) -> None:
        self.uri = uri
        self._pin = pin
        self._library = _Library.load(module_path or uri.module_path or DEFAULT_MODULE)
        self.lock = self._library.lock
        with self.lock:
            self._generation = self._library.generation
            self._session = self._open()
        self._private: pkcs11.PrivateKey | None = None
        self._broken = False

    def _open(self) -> pkcs11.Session:
        query: dict[str, Any] = {"token_label": self.uri.token}
        if self.uri.serial is not None:
            query["token_serial"] = self.uri.serial.encode()
        try:
            token = self._library.lib.get_token(**query)
        except exceptions.NoSuchToken as exc:
            raise TokenConfigError(f"key URI: no token labelled {self.uri.token!r}") from exc
        except exceptions.MultipleTokensReturned as exc:
            raise TokenConfigError(f"key URI: several tokens labelled {self.uri.token!r}") from exc
        try:
            return token.open(rw=True, user_pin=self._pin)
        except exceptions.UserAlreadyLoggedIn:
            # PKCS#11 logs in an application, not a session: this process already did.
            return token.open(rw=True)
        except (exceptions.PinIncorrect, exceptions.PinLenRange) as exc:
            raise TokenConfigError(f"token {self.uri.token!r}: the PIN is wrong") from exc
        except exceptions.PKCS11Error as exc:
            raise TokenConfigError(
                f"token {self.uri.token!r}: cannot log in ({_name(exc)})"
            ) from exc

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
            self._private = found[1]
        return TokenKey(self, found[0])

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
            self._private = private
        return TokenKey(self, public)

    def _usable(self) -> pkcs11.PrivateKey:
        """The key's private handle, in a session opened again if the last one failed or the
        module was initialised again since (caller holds the lock); TokenError while the token
        cannot be reached or the key not found."""
        stale = self._broken or self._generation != self._library.generation
        if stale and not self._reopen():
            self._library.reinitialize(self._generation)
            if not self._reopen():
                raise TokenError(f"token {self.uri.token!r}: cannot be reached again")
        if self._private is None:
            raise TokenError(f"token {self.uri.token!r}: no key opened")
        return self._private

    def _reopen(self) -> bool:
        """A new session with the key found again in it; False when the token or key is not
        (yet) there."""
        generation = self._library.generation
        with contextlib.suppress(exceptions.PKCS11Error):  # as gone as the token was
            self._session.close()
        try:
            self._session = self._open()
            found = self._find()
        except (TokenConfigError, exceptions.PKCS11Error):
            self._broken, self._generation = True, generation
            return False
        if found is None:
            self._broken, self._generation = True, generation
            return False
        self._private, self._broken, self._generation = found[1], False, generation
        return True

    def sign_ecdsa_sha256(self, data: bytes) -> bytes:
        """The token's raw r||s over SHA-256(data); TokenError when the token fails. The digest is
        made here and signed with plain CKM_ECDSA, which every token has (SoftHSM 2.6 lacks
        CKM_ECDSA_SHA256); the key never leaves the token either way."""
        digest = hashes.Hash(hashes.SHA256())
        digest.update(data)
        value = digest.finalize()
        with self.lock:
            private = self._usable()
            if not isinstance(private, SignMixin):
                raise TokenError(f"token {self.uri.token!r}: the key cannot sign")
            try:
                raw = private.sign(value, mechanism=Mechanism.ECDSA)
            except exceptions.PKCS11Error as exc:
                self._broken = True
                raise TokenError(
                    f"token {self.uri.token!r} refused a signature ({_name(exc)})"
                ) from exc
        return bytes(raw)

    def protected(self) -> bool:
        """The token says the key is sensitive and never was, nor is, extractable."""
        with self.lock:
            private = self._usable()
            try:
                return bool(
                    private[Attribute.SENSITIVE]
                    and not private[Attribute.EXTRACTABLE]
                    and private[Attribute.NEVER_EXTRACTABLE]
                )
            except exceptions.PKCS11Error as exc:
                self._broken = True
                raise TokenError(f"token {self.uri.token!r}: {_name(exc)}") from exc


class TokenKey(ec.EllipticCurvePrivateKey):
    """A P-256 key held by a token: signs through it, never exports."""

    def __init__(self, session: TokenSession, public: pkcs11.PublicKey) -> None:
        self._session = session
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
        return self._session.protected()

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
        raw = self._session.sign_ecdsa_sha256(bytes(data))
        # DER ECDSA-Sig-Value by cryptography (Rust), a tenth of python-pkcs11's asn1crypto's.
        half = len(raw) // 2
        return utils.encode_dss_signature(
            int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big")
        )

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
    """The signer's keys in one token: new ones per CA generation (its root's and its
    intermediate's), each labelled `<the URI's object>-<name>`, and those the CA Secret names
    found again. One logged-in session is shared (PKCS#11 logs a process in once)."""

    def __init__(self, uri: KeyURI, pin: str) -> None:
        self.uri = uri
        self._pin = pin
        self._session = TokenSession(uri, pin)  # the start-up check: the token and the PIN
        self._sessions: dict[KeyURI, TokenSession] = {}
        # Keys found once are not looked up again each time the CA Secret changes.
        self._keys: dict[KeyURI, TokenKey] = {}

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
        uri = dataclasses.replace(self.uri, object=label, id=None)
        key = self._keys[uri] = self._for(uri).generate()
        return key

    def resolve(self, reference: str, field: str = ca.TLS_KEY_URI) -> TokenKey:
        """The key a CA Secret's URI (in `field`) names, in this signer's token; ca.CAError
        naming `field` when it cannot be used (another token, no such key)."""
        try:
            uri = pkcs11uri.parse(reference)
        except pkcs11uri.URIError as exc:
            raise ca.CAError(f"{field}: {exc}") from None
        if uri.token != self.uri.token:
            raise ca.CAError(
                f"{field}: names token {uri.token!r}, but the signer's is "
                f"{self.uri.token!r} (--ca-key-uri)"
            )
        mine = dataclasses.replace(self.uri, object=uri.object, id=uri.id)
        if (known := self._keys.get(mine)) is not None:
            return known
        try:
            key = self._keys[mine] = self._for(mine).key()
        except TokenConfigError as exc:
            raise ca.CAError(f"{field}: {exc}") from None
        except (TokenError, exceptions.PKCS11Error) as exc:
            raise ca.CAError(
                f"{field}: token {uri.token!r} cannot be reached ({_name(exc)})"
            ) from None
        return key


def _name(exc: BaseException) -> str:
    """The PKCS#11 error's class name: its message may quote attributes, never key material,
    but the name is all an operator needs."""
    return type(exc).__name__
