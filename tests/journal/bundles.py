"""Bundles from another Recorder, made by this code under another URL and key directory, and forged ones: a
chain rebuilt and re-signed with a key the forger holds, so it is internally consistent and only what this
Recorder trusts can tell it apart."""

import base64
import copy
from datetime import UTC, datetime

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from journal import services
from journal.models import RecorderKey, Run
from journal.record import chain

OTHER = "https://undo.other.example"


def foreign_bundle(settings, tmp_path, make, *, origin: str = OTHER) -> dict:
    """The bundle of a run that `make()` records on another Recorder (URL `origin`, its own keys); that
    Recorder's run and keys are then gone from this database, as if it had been another machine."""
    here_url, here_keys = settings.PUBLIC_URL, settings.RECORDER_KEY_DIR
    ours = list(RecorderKey.objects.filter(origin=""))
    RecorderKey.objects.filter(origin="").delete()
    settings.PUBLIC_URL, settings.RECORDER_KEY_DIR = origin, tmp_path / f"keys-of-{abs(hash(origin))}"
    try:
        run = make()
        bundle = services.export_bundle(run=run)
        Run.objects.filter(pk=run.pk).delete()
        RecorderKey.objects.filter(origin="").delete()
    finally:
        RecorderKey.objects.bulk_create(ours)
        settings.PUBLIC_URL, settings.RECORDER_KEY_DIR = here_url, here_keys
    return bundle


def new_key(key_id: str = "rk-20991231-forged00", valid_from: str | None = None):
    private = Ed25519PrivateKey.generate()
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    wire = {
        "keyId": key_id,
        "alg": "Ed25519",
        "publicKey": base64.urlsafe_b64encode(raw).rstrip(b"=").decode(),
        "validFrom": valid_from or datetime.now(UTC).isoformat(),
        "validUntil": None,
    }
    return private, wire


def resign(bundle: dict, private, wire_key: dict, *, run_id: str | None = None, **header) -> dict:
    """`bundle` with its header changed as given, its chain rebuilt and every checkpoint re-signed with
    `private`: a forgery as good as the forger's key."""
    forged = copy.deepcopy(bundle)
    if run_id:
        forged["run"]["id"] = run_id
    forged["run"].update(header)
    entries, prev = [], chain.GENESIS
    for entry in forged["entries"]:
        data = dict(forged["run"]) if entry["event"] == chain.HEADER_EVENT else entry["data"]
        rebuilt = chain.make_entry(
            seq=entry["seq"], ts=entry["ts"], event=entry["event"], data=data, prev_hash=prev
        )
        entries.append(rebuilt)
        prev = rebuilt["hash"]
    forged["entries"] = entries
    by_seq = {e["seq"]: e["hash"] for e in entries}
    forged["checkpoints"] = [
        {
            "run": forged["run"]["id"],
            "seq": c["seq"],
            "headHash": by_seq[c["seq"]],
            "keyId": wire_key["keyId"],
            "signature": chain.sign(
                private,
                chain.checkpoint_payload(run=forged["run"]["id"], seq=c["seq"], head_hash=by_seq[c["seq"]]),
            ),
        }
        for c in forged["checkpoints"]
    ]
    forged["publicKeys"] = [wire_key]
    return forged
