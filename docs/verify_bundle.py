"""Check an exported run bundle offline: python verify_bundle.py run.json

The hash chain, its signed checkpoints, the signed run header, and every approval's passkey signature over
the exact plan (or held call) it decided. Needs only `cryptography` and `rfc8785`
(`pip install cryptography rfc8785`); the project's tests run this very file against exported bundles.
Exits 0 and prints what it checked, or stops at the first thing that does not hold.
"""

import base64
import hashlib
import json
import sys

try:
    import rfc8785
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
except ImportError as missing:  # run by a bare python: say what to install, not a traceback
    sys.exit(f"verify_bundle.py needs the packages cryptography and rfc8785 ({missing.name} is missing): "
             "pip install cryptography rfc8785, or run it with the project's .venv/bin/python.")

PLAN_FIELDS = ("plan", "digest", "decision", "choices", "nonce")
ACTION_FIELDS = ("action", "digest", "decision", "nonce")


def b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def check_chain(bundle: dict) -> dict[int, str]:
    """Each entry links to the one before and hashes to what it says (SHA-256 of its RFC 8785 bytes)."""
    prev, seen = "GENESIS", {}
    for n, entry in enumerate(bundle["entries"], start=1):
        body = {k: v for k, v in entry.items() if k != "hash"}
        assert entry["seq"] == n, f"entry {n}: seq is {entry['seq']}"
        assert entry["prevHash"] == prev, f"entry {n}: prevHash does not link to entry {n - 1}"
        assert hashlib.sha256(rfc8785.dumps(body)).hexdigest() == entry["hash"], f"entry {n}: content changed"
        prev = seen[n] = entry["hash"]
    return seen


def check_checkpoints(bundle: dict, seen: dict[int, str]) -> None:
    """The Recorder's Ed25519 signatures cover every entry, and the first entry is the run's header."""
    keys = {k["keyId"]: Ed25519PublicKey.from_public_bytes(b64(k["publicKey"])) for k in bundle["publicKeys"]}
    assert bundle["checkpoints"], "no signed checkpoint"
    for cp in bundle["checkpoints"]:
        payload = {"run": bundle["run"]["id"], "seq": cp["seq"], "headHash": cp["headHash"]}
        keys[cp["keyId"]].verify(b64(cp["signature"]), rfc8785.dumps(payload))  # raises if forged
        assert seen.get(cp["seq"]) == cp["headHash"], f"checkpoint {cp['seq']}: entries were cut or changed"
    assert bundle["checkpoints"][-1]["seq"] == len(seen), "entries after the last checkpoint are unsigned"
    first = bundle["entries"][0]
    assert first["event"] == "run" and first["data"] == bundle["run"], (
        "the run header is not the signed first entry"
    )


def check_approval(approval: dict, on_chain: set) -> None:
    """A passkey (WebAuthn) signature over exactly the plan or held call decided, and on the run's chain."""
    a, nonce = approval, approval["nonce"]
    fields = {k: a[k] for k in (PLAN_FIELDS if "plan" in a else ACTION_FIELDS)}
    client_data = b64(a["assertion"]["clientDataJSON"])
    client = json.loads(client_data)
    assert client["type"] == "webauthn.get", f"approval {nonce}: not a signature"
    assert b64(client["challenge"]) == hashlib.sha256(rfc8785.dumps(fields)).digest(), \
        f"approval {nonce}: the passkey signed something else"
    auth_data = b64(a["assertion"]["authenticatorData"])
    assert auth_data[32] & 0x05 == 0x05, f"approval {nonce}: user not present and verified"
    signed, signature = auth_data + hashlib.sha256(client_data).digest(), b64(a["assertion"]["signature"])
    key = serialization.load_der_public_key(b64(a["publicKey"]))
    if isinstance(key, ec.EllipticCurvePublicKey):  # each raises if forged
        key.verify(signature, signed, ec.ECDSA(hashes.SHA256()))
    elif isinstance(key, rsa.RSAPublicKey):
        key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
    else:
        key.verify(signature, signed)
    assert (a.get("plan") or a.get("action"), nonce, a["digest"]) in on_chain, \
        f"approval {nonce}: not in the run's record"


def verify(bundle: dict) -> str:
    """What was checked, in one line; an AssertionError (or a signature error) names what does not hold."""
    seen = check_chain(bundle)
    check_checkpoints(bundle, seen)
    on_chain = {(e["data"].get("plan") or e["data"].get("action"), e["data"]["nonce"], e["data"]["digest"])
                for e in bundle["entries"] if e["event"] in ("approval", "action_decision")}
    for approval in bundle["approvals"]:
        check_approval(approval, on_chain)
    return (f"OK: {len(seen)} entries, {len(bundle['checkpoints'])} signed checkpoints, "
            f"{len(bundle['approvals'])} signed approvals")


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as file:
        print(verify(json.load(file)))
