"""A software passkey for tests: real WebAuthn answers (ES256, "none" attestation), built by hand so that
tests can also build wrong ones (another origin, no user verification, a replayed counter)."""

import hashlib
import json
import secrets

import cbor2
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from webauthn.helpers import bytes_to_base64url

UP, UV, AT = 0x01, 0x04, 0x40


class SoftKey:
    def __init__(self, *, rp_id: str = "localhost", origin: str = "http://localhost:8000"):
        self.rp_id, self.origin = rp_id, origin
        self.private = ec.generate_private_key(ec.SECP256R1())
        self.credential_id = secrets.token_bytes(32)
        self.sign_count = 0

    def _cose_public_key(self) -> bytes:
        numbers = self.private.public_key().public_numbers()
        return cbor2.dumps(
            {1: 2, 3: -7, -1: 1, -2: numbers.x.to_bytes(32, "big"), -3: numbers.y.to_bytes(32, "big")}
        )

    def _client_data(self, kind: str, challenge: bytes, origin: str | None) -> bytes:
        return json.dumps(
            {
                "type": kind,
                "challenge": bytes_to_base64url(challenge),
                "origin": origin or self.origin,
                "crossOrigin": False,
            }
        ).encode()

    def register(self, challenge: bytes, *, origin: str | None = None, rp_id: str | None = None,
                 flags: int = UP | UV | AT) -> dict:
        """What `navigator.credentials.create()` gives, as JSON."""
        auth_data = (
            hashlib.sha256((rp_id or self.rp_id).encode()).digest()
            + bytes([flags])
            + self.sign_count.to_bytes(4, "big")
            + bytes(16)
            + len(self.credential_id).to_bytes(2, "big")
            + self.credential_id
            + self._cose_public_key()
        )
        attestation = cbor2.dumps({"fmt": "none", "attStmt": {}, "authData": auth_data})
        return {
            "id": bytes_to_base64url(self.credential_id),
            "rawId": bytes_to_base64url(self.credential_id),
            "type": "public-key",
            "clientExtensionResults": {},
            "response": {
                "clientDataJSON": bytes_to_base64url(self._client_data("webauthn.create", challenge, origin)),
                "attestationObject": bytes_to_base64url(attestation),
                "transports": ["internal"],
            },
        }

    def sign(self, challenge: bytes, *, origin: str | None = None, rp_id: str | None = None,
             flags: int = UP | UV, count: int | None = None) -> dict:
        """What `navigator.credentials.get()` gives, as JSON; the counter moves on unless `count` says."""
        self.sign_count = self.sign_count + 1 if count is None else count
        auth_data = (hashlib.sha256((rp_id or self.rp_id).encode()).digest() + bytes([flags])
                     + self.sign_count.to_bytes(4, "big"))
        client_data = self._client_data("webauthn.get", challenge, origin)
        signature = self.private.sign(
            auth_data + hashlib.sha256(client_data).digest(), ec.ECDSA(hashes.SHA256())
        )
        return {
            "id": bytes_to_base64url(self.credential_id), "rawId": bytes_to_base64url(self.credential_id),
            "type": "public-key", "clientExtensionResults": {},
            "response": {"clientDataJSON": bytes_to_base64url(client_data),
                         "authenticatorData": bytes_to_base64url(auth_data),
                         "signature": bytes_to_base64url(signature), "userHandle": None},
        }
