"""WebAuthn for approvers, over py_webauthn: what the browser is asked, and whether its answer holds.

No ORM and no clock: `approver.services` keeps the credentials and the one-time challenges. Every answer
from a browser is untrusted input; whatever py_webauthn refuses becomes a `PasskeyRefused` with a message
for the person at the keyboard.
"""

from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from django.conf import settings
from webauthn import (
    generate_authentication_options,
    generate_registration_options,
    options_to_json,
    verify_authentication_response,
    verify_registration_response,
)
from webauthn.helpers import base64url_to_bytes, bytes_to_base64url
from webauthn.helpers.cose import COSEAlgorithmIdentifier
from webauthn.helpers.decode_credential_public_key import decode_credential_public_key
from webauthn.helpers.decoded_public_key_to_cryptography import decoded_public_key_to_cryptography
from webauthn.helpers.exceptions import (
    InvalidAuthenticationResponse,
    InvalidJSONStructure,
    InvalidRegistrationResponse,
    WebAuthnException,
)
from webauthn.helpers.structs import (
    AuthenticatorSelectionCriteria,
    PublicKeyCredentialDescriptor,
    ResidentKeyRequirement,
    UserVerificationRequirement,
)

from journal.errors import Refused

# How long a challenge (to enrol a passkey, or to sign with one) waits for the authenticator.
CHALLENGE_SECONDS = 300

# The algorithms we accept: ES256 and EdDSA, then RS256 for platforms that offer nothing else.
ALGORITHMS = [COSEAlgorithmIdentifier.ECDSA_SHA_256, COSEAlgorithmIdentifier.EDDSA,
              COSEAlgorithmIdentifier.RSASSA_PKCS1_v1_5_SHA_256]


class PasskeyRefused(Refused):
    """The browser's answer does not hold; `message` says why, in words for the user."""


@dataclass(frozen=True)
class RelyingParty:
    id: str  # the host name, e.g. "undo.example.com"
    name: str
    origins: tuple[str, ...]  # e.g. ("https://undo.example.com",)


def this_site() -> RelyingParty:
    """The relying party these settings describe (read at call time: tests and deployments change them)."""
    return RelyingParty(id=settings.WEBAUTHN_RP_ID, name=settings.WEBAUTHN_RP_NAME,
                        origins=tuple(settings.WEBAUTHN_ORIGINS))


@dataclass(frozen=True)
class NewCredential:
    credential_id: str  # base64url
    public_key: str  # COSE, base64url
    sign_count: int
    transports: list[str]


def registration_options(*, rp: RelyingParty, user_handle: bytes, user_name: str, display_name: str,
                         existing: list[str], challenge: bytes) -> str:
    """The JSON for `navigator.credentials.create()`: user verification required, existing passkeys
    excluded so the same authenticator is not enrolled twice."""
    options = generate_registration_options(
        rp_id=rp.id,
        rp_name=rp.name,
        user_id=user_handle,
        user_name=user_name,
        user_display_name=display_name,
        challenge=challenge,
        supported_pub_key_algs=ALGORITHMS,
        authenticator_selection=AuthenticatorSelectionCriteria(
            resident_key=ResidentKeyRequirement.PREFERRED,
            user_verification=UserVerificationRequirement.REQUIRED,
        ),
        exclude_credentials=[PublicKeyCredentialDescriptor(id=base64url_to_bytes(c)) for c in existing],
    )
    return options_to_json(options)


def verify_registration(*, rp: RelyingParty, credential: Any, challenge: bytes) -> NewCredential:
    """Check a `navigator.credentials.create()` answer against the challenge we issued, our origin and
    RP id, with the user verified."""
    if not isinstance(credential, dict | str):
        raise PasskeyRefused("The browser sent no passkey.")
    try:
        verified = verify_registration_response(
            credential=credential,
            expected_challenge=challenge, expected_rp_id=rp.id, expected_origin=list(rp.origins),
            require_user_verification=True, supported_pub_key_algs=ALGORITHMS,
        )
    except InvalidRegistrationResponse as exc:
        raise PasskeyRefused(f"The passkey was not accepted: {exc}") from None
    except InvalidJSONStructure as exc:
        raise PasskeyRefused(f"The browser's answer is malformed: {exc}") from None
    except (WebAuthnException, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PasskeyRefused(f"The browser's answer is malformed ({type(exc).__name__}).") from None
    transports = credential.get("response", {}).get("transports") if isinstance(credential, dict) else None
    return NewCredential(
        credential_id=bytes_to_base64url(verified.credential_id),
        public_key=bytes_to_base64url(verified.credential_public_key),
        sign_count=verified.sign_count,
        transports=[t for t in transports if isinstance(t, str)][:8] if isinstance(transports, list) else [],
    )


def authentication_options(*, rp: RelyingParty, challenge: bytes, credential_ids: list[str]) -> str:
    """The JSON for `navigator.credentials.get()`: only this approver's active passkeys, user verified."""
    options = generate_authentication_options(
        rp_id=rp.id, challenge=challenge, user_verification=UserVerificationRequirement.REQUIRED,
        allow_credentials=[PublicKeyCredentialDescriptor(id=base64url_to_bytes(c)) for c in credential_ids],
    )
    return options_to_json(options)


def credential_id_of(credential: Any) -> str:
    """The credential id an assertion claims to come from (checked by the signature, not trusted before)."""
    raw = credential.get("rawId") or credential.get("id") if isinstance(credential, dict) else None
    if not isinstance(raw, str) or not raw or len(raw) > 1400:
        raise PasskeyRefused("The browser's answer names no passkey.")
    return raw


def verify_assertion(
    *, rp: RelyingParty, credential: Any, challenge: bytes, public_key: str, sign_count: int
) -> int:
    """Check a `navigator.credentials.get()` answer: signed by this passkey, over our challenge, for our
    origin and RP id, with the user verified, and a signature counter that moved on (a cloned or replayed
    authenticator does not). Returns the new counter."""
    if not isinstance(credential, dict):
        raise PasskeyRefused("The browser sent no signature.")
    try:
        verified = verify_authentication_response(
            credential=credential, expected_challenge=challenge, expected_rp_id=rp.id,
            expected_origin=list(rp.origins), credential_public_key=base64url_to_bytes(public_key),
            credential_current_sign_count=sign_count, require_user_verification=True,
        )
    except InvalidAuthenticationResponse as exc:
        raise PasskeyRefused(f"The signature was not accepted: {_in_words(str(exc))}") from None
    except (WebAuthnException, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PasskeyRefused(f"The browser's answer is malformed ({type(exc).__name__}).") from None
    return verified.new_sign_count


# The WebAuthn library's reasons for refusing a signature, in words for the person signing (its own are for
# developers: "Response sign count of 1 was not greater than current count of 2").
_REASONS = (
    ("sign count", "this passkey's signature counter went backwards, which is what a copied passkey does. "
                   "Nothing was signed; tell an admin, who can revoke it."),
    ("challenge", "it was made for another request (a page left open, or signed twice). Reload the page and "
                  "sign again."),
    ("origin", "it was made for another site than this one."),
    ("rp id", "it was made for another site than this one."),
    ("user verification", "your passkey did not confirm it is you (PIN, fingerprint or face). Sign again, "
                          "and confirm when it asks."),
)


def _in_words(reason: str) -> str:
    said = reason.lower()
    return next((words for key, words in _REASONS if key in said),
                "it does not check out against your passkey. Sign again; if it happens again, tell an admin.")


def spki(public_key: str) -> str:
    """A passkey's COSE public key as base64url SubjectPublicKeyInfo DER, which any X.509 toolkit (and the
    README's offline verifier, with only `cryptography`) can load."""
    key = decoded_public_key_to_cryptography(decode_credential_public_key(base64url_to_bytes(public_key)))
    return bytes_to_base64url(key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo))
