"""verify_run, export_run, import_run and rotate_recorder_key against the database."""

import importlib.util
import io
import json
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from journal import services
from journal.models import ChainEntry, Checkpoint, RecorderKey, Run, Step, Team
from journal.record import keys

from .bundles import OTHER, foreign_bundle, new_key, resign
from .factories import make_run

VERIFIER = Path(__file__).resolve().parents[2] / "docs" / "verify_bundle.py"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def agent(dana):
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    return agent


@pytest.fixture
def run(agent, settings):
    settings.RECORDER_CHECKPOINT_EVERY = 4
    run = make_run(agent, steps=5)  # the header and 10 entries, checkpoints at 4 and 8
    services.checkpoint_run(run=run)  # and at 11
    return run


def verify(run):
    """Run the command; return (exit code, output)."""
    from io import StringIO

    out, err = StringIO(), StringIO()
    try:
        call_command("verify_run", str(run.public_id), stdout=out, stderr=err)
    except SystemExit as exit_:
        return exit_.code, err.getvalue()
    return 0, out.getvalue()


def test_an_intact_run_verifies(run):
    code, output = verify(run)
    assert code == 0, output
    assert "11 entries, 3 signed checkpoints" in output


@pytest.mark.parametrize("seq", range(1, 12))
def test_changing_any_entry_is_found(run, seq):
    ChainEntry.objects.filter(run=run, seq=seq).update(data={"forged": True})
    code, output = verify(run)
    assert code == 1 and f"entry {seq}" in output


@pytest.mark.parametrize("seq", range(1, 12))
def test_removing_any_entry_is_found(run, seq):
    ChainEntry.objects.filter(run=run, seq=seq).delete()
    code, output = verify(run)
    assert code == 1
    assert f"entry {seq}" in output


def test_inserting_an_entry_is_found(run):
    # Make room at seq 4 by moving the later entries up, as someone rewriting the table would.
    for entry in ChainEntry.objects.filter(run=run, seq__gte=4).order_by("-seq"):
        ChainEntry.objects.filter(pk=entry.pk).update(seq=entry.seq + 1)
    third = ChainEntry.objects.get(run=run, seq=3)
    from journal.record import chain

    forged = chain.make_entry(seq=4, ts=third.ts, event="call", data={"step": 99}, prev_hash=third.hash)
    ChainEntry.objects.create(run=run, seq=4, ts=forged["ts"], event="call", data=forged["data"],
                              prev_hash=forged["prevHash"], hash=forged["hash"])
    code, output = verify(run)
    assert code == 1 and "entry 4" in output


def test_reordering_entries_is_found(run):
    a, b = ChainEntry.objects.get(run=run, seq=5), ChainEntry.objects.get(run=run, seq=6)
    ChainEntry.objects.filter(pk=a.pk).update(seq=1000)
    ChainEntry.objects.filter(pk=b.pk).update(seq=5)
    ChainEntry.objects.filter(pk=a.pk).update(seq=6)
    code, output = verify(run)
    assert code == 1 and "entry 5" in output


def test_cutting_the_tail_after_a_checkpoint_is_found(run):
    ChainEntry.objects.filter(run=run, seq__gte=9).delete()
    code, output = verify(run)
    assert code == 1 and "entry 9" in output and "cut" in output


def test_a_tampered_checkpoint_is_found(run):
    Checkpoint.objects.filter(run=run, seq=8).update(signature="A" * 86)
    code, output = verify(run)
    assert code == 1 and "signature" in output


def test_an_unknown_run_id_is_a_clear_error(db):
    with pytest.raises(CommandError, match="not a run id"):
        call_command("verify_run", "D-881")


def test_rotating_the_key_keeps_old_checkpoints_verifiable(agent, settings):
    settings.RECORDER_CHECKPOINT_EVERY = 2
    run = make_run(agent, steps=2)
    old = RecorderKey.objects.get()
    call_command("rotate_recorder_key", stdout=open("/dev/null", "w"))
    make_run(agent, steps=2)
    run.refresh_from_db()
    assert set(run.checkpoints.values_list("key_id", flat=True)) == {old.key_id, keys.signing_key()[0]}
    assert RecorderKey.objects.count() == 2 and RecorderKey.objects.get(key_id=old.key_id).valid_until
    assert verify(run)[0] == 0


def test_private_keys_are_kept_outside_the_repository_and_private(agent, settings):
    key_id, _ = keys.signing_key()
    path = settings.RECORDER_KEY_DIR / f"{key_id}.ed25519"
    assert path.exists() and path.stat().st_mode & 0o077 == 0
    assert Path(__file__).resolve().parents[2] not in path.resolve().parents


# -- export and the offline verifier -----------------------------------------------------------------------


def readme_verifier(tmp_path=None) -> Path:
    """The offline verifier the documentation shows (docs/run-record.md includes this very file)."""
    return VERIFIER


def test_the_verifier_is_importable_and_says_what_it_checked(run, tmp_path):
    spec = importlib.util.spec_from_file_location("verify_bundle", VERIFIER)
    verifier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verifier)
    bundle = json.loads(export(run, tmp_path).read_text())
    assert verifier.verify(bundle) == "OK: 11 entries, 3 signed checkpoints, 0 signed approvals"
    bundle["entries"][2]["data"]["arguments"] = {"n": 99}
    with pytest.raises(AssertionError, match="entry 3: content changed"):
        verifier.verify(bundle)


def export(run, tmp_path) -> Path:
    path = tmp_path / "run.json"
    call_command("export_run", str(run.public_id), "-o", str(path), stderr=open("/dev/null", "w"))
    return path


def test_the_readme_verifier_accepts_an_exported_bundle(run, tmp_path):
    result = subprocess.run([sys.executable, readme_verifier(tmp_path), export(run, tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "OK: 11 entries" in result.stdout


@pytest.mark.parametrize("tamper", ["change", "remove", "cut", "checkpoint"])
def test_the_readme_verifier_refuses_a_tampered_bundle(run, tmp_path, tamper):
    path = export(run, tmp_path)
    bundle = json.loads(path.read_text())
    if tamper == "change":
        bundle["entries"][3]["data"]["arguments"] = {"n": 99}
    elif tamper == "remove":
        del bundle["entries"][3]
    elif tamper == "cut":
        del bundle["entries"][8:]
    else:
        bundle["checkpoints"][0]["headHash"] = bundle["entries"][0]["hash"]
    path.write_text(json.dumps(bundle))
    result = subprocess.run([sys.executable, readme_verifier(tmp_path), path], capture_output=True, text=True)
    assert result.returncode != 0


# -- import ------------------------------------------------------------------------------------------------


@pytest.fixture
def foreign(agent, settings, tmp_path):
    """A bundle of five calls recorded by another Recorder (https://undo.other.example)."""
    settings.RECORDER_CHECKPOINT_EVERY = 4
    return foreign_bundle(settings, tmp_path, lambda: make_run(agent, steps=5, run_key="run:elsewhere"))


def write(tmp_path, bundle, name="bundle.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(bundle))
    return path


def test_an_imported_run_belongs_to_the_team_named_and_an_unknown_team_imports_nothing(foreign, tmp_path):
    with pytest.raises(CommandError, match="No team is named 'nobody'. Nothing was imported."):
        call_command("import_run", str(write(tmp_path, foreign)), "--team", "nobody")
    assert not Run.objects.exists()
    Team.objects.create(name="payments")
    call_command("import_run", str(write(tmp_path, foreign)), "--team", "payments", stdout=io.StringIO())
    assert Run.objects.get().team.name == "payments"


def test_a_bundle_from_another_recorder_imports_and_verifies(foreign, tmp_path):
    call_command("import_run", str(write(tmp_path, foreign)), stdout=open("/dev/null", "w"))
    imported = Run.objects.get()
    assert imported.state == "imported" and imported.imported_from == OTHER
    assert imported.step_count == 5 and Step.objects.filter(run=imported).count() == 5
    assert set(RecorderKey.objects.values_list("origin", flat=True)) == {OTHER}
    assert verify(imported)[0] == 0
    again = services.export_bundle(run=imported)
    assert again["run"] == foreign["run"] and again["run"]["recorder"] == OTHER
    assert again["entries"] == foreign["entries"] and again["publicKeys"] == foreign["publicKeys"]


def refuses(path, pattern):
    before = (
        Run.objects.count(),
        ChainEntry.objects.count(),
        Step.objects.count(),
        RecorderKey.objects.count(),
    )
    with pytest.raises(CommandError, match=pattern):
        call_command("import_run", str(path))
    after = (
        Run.objects.count(),
        ChainEntry.objects.count(),
        Step.objects.count(),
        RecorderKey.objects.count(),
    )
    assert before == after, "a refused import wrote something"


@pytest.mark.parametrize(
    ("mutate", "pattern"),
    [
        (lambda b: b["entries"][2].update(seq="3"), r"entries\.2\.seq"),
        (lambda b: b["entries"][2].pop("hash"), r"entries\.2\.hash"),
        (lambda b: b["entries"][2].update(extra=1), r"entries\.2\.extra"),
        (lambda b: b["publicKeys"][0].update(alg="RSA"), r"publicKeys\.0\.alg"),
        (lambda b: b.update(format="something-else"), "format"),
        (lambda b: b["entries"][4]["data"].update(step=42), "entry 5"),
        (lambda b: b["entries"].pop(), "not covered by a signed checkpoint|entries after"),
        (lambda b: b.update(checkpoints=[]), "no signed checkpoint"),
        (lambda b: b["run"].update(id="not-a-uuid"), "not a UUID|names another run"),
        # The header is signed (finding 10): relabelling it, or giving it a date nobody can read, is refused.
        (lambda b: b["run"].update(agent="mallory"), "agent differs from the signed header"),
        (lambda b: b["run"].update(onBehalfOf="mallory"), "onBehalfOf differs from the signed header"),
        (
            lambda b: b["run"].update(recorder="https://undo.third.example"),
            "recorder differs from the signed header",
        ),
        (lambda b: b["run"].update(startedAt="yesterday"), r"run\.startedAt.*not an ISO 8601"),
        (
            lambda b: b["publicKeys"][0].update(validFrom="garbage"),
            r"publicKeys\.0\.validFrom.*not an ISO 8601",
        ),
        (lambda b: b["publicKeys"][0].update(validFrom="2026-11-01T00:00:00"), "has no UTC offset"),
        (lambda b: b["entries"][3].update(ts="Tuesday"), r"entries\.3\.ts.*not a chain timestamp"),
        (lambda b: b["run"].update(recorder=""), r"run\.recorder.*not the URL of a Recorder"),
    ],
)
def test_malformed_or_tampered_bundles_are_refused_whole(foreign, tmp_path, mutate, pattern):
    mutate(foreign)
    refuses(write(tmp_path, foreign), pattern)


def test_a_duplicate_key_in_the_header_is_refused(foreign, tmp_path):
    """Finding 10: `"agent": "mallory"` after the real one relabelled an imported run."""
    text = json.dumps(foreign).replace(
        '"agent": "sales-bot",', '"agent": "sales-bot", "agent": "mallory",', 1
    )
    assert text.count('"mallory"') == 1
    path = tmp_path / "bundle.json"
    path.write_text(text)
    refuses(path, "'agent' appears twice")


def test_a_forged_bundle_cannot_plant_a_key_in_this_recorders_own_key_set(run, agent, tmp_path):
    """Finding 1: a bundle re-signed with a fresh key (validFrom 2099, recorder "") imported, and its key
    became one of this Recorder's: exports of local runs listed it and key rotation retired the real one."""
    ours = set(RecorderKey.objects.values_list("key_id", "public_key"))
    signing = keys.signing_key()[0]
    genuine = services.export_bundle(run=run)
    private, key = new_key(valid_from="2099-12-31T00:00:00+00:00")
    as_local = resign(genuine, private, key, run_id=str(uuid.uuid4()), recorder="")
    refuses(write(tmp_path, as_local), r"run\.recorder.*not the URL of a Recorder")
    as_here = resign(genuine, private, key, run_id=str(uuid.uuid4()), recorder="http://localhost:8000")
    refuses(write(tmp_path, as_here), "says it comes from this Recorder")
    from_the_future = resign(genuine, private, key, run_id=str(uuid.uuid4()), recorder="https://evil.example")
    refuses(write(tmp_path, from_the_future), "valid only from 2099-12-31.*has not come yet")

    private, key = new_key()
    foreign = resign(genuine, private, key, run_id=str(uuid.uuid4()), recorder="https://evil.example")
    call_command("import_run", str(write(tmp_path, foreign)), stdout=open("/dev/null", "w"))
    imported = Run.objects.get(public_id=foreign["run"]["id"])
    assert imported.imported_from == "https://evil.example" and verify(imported)[0] == 0
    assert set(RecorderKey.objects.filter(origin="").values_list("key_id", "public_key")) == ours
    assert RecorderKey.objects.get(key_id=key["keyId"]).origin == "https://evil.example"
    assert keys.signing_key()[0] == signing
    assert [k["keyId"] for k in services.export_bundle(run=run)["publicKeys"]] == [signing]
    assert services.export_bundle(run=imported)["run"]["recorder"] == "https://evil.example"
    call_command("rotate_recorder_key", stdout=open("/dev/null", "w"))
    assert RecorderKey.objects.get(key_id=key["keyId"]).valid_until is None  # not retired as if it were ours
    assert RecorderKey.objects.get(key_id=signing).valid_until is not None
    assert verify(run)[0] == 0


def test_an_origin_is_pinned_to_the_keys_of_its_first_import(foreign, agent, settings, tmp_path):
    call_command("import_run", str(write(tmp_path, foreign)), stdout=open("/dev/null", "w"))
    private, key = new_key("rk-20261201-other000")
    impostor = resign(foreign, private, key, run_id=str(uuid.uuid4()))
    refuses(write(tmp_path, impostor), f"rk-20261201-other000 is not a key of {OTHER}.*pinned")
    # The same Recorder's next run, signed by the pinned key, imports.
    second = foreign_bundle(settings, tmp_path, lambda: make_run(agent, steps=1, run_key="run:second"))
    assert second["publicKeys"] != foreign["publicKeys"]  # made from scratch: a new key for the same origin
    refuses(write(tmp_path, second), "pinned")


def test_a_checkpoint_signed_by_a_key_retired_before_its_entries_is_refused(foreign, tmp_path):
    private, key = new_key("rk-20260101-retired0", valid_from="2026-01-01T00:00:00+00:00")
    key["validUntil"] = "2026-06-01T00:00:00+00:00"  # the run's entries are from 2026-11-29
    refuses(write(tmp_path, resign(foreign, private, key)), "retired .* before entry 4 was written")
    key["validUntil"] = "2025-01-01T00:00:00+00:00"
    refuses(write(tmp_path, resign(foreign, private, key)), "stops being valid .* before it starts")


def test_an_entry_dated_in_the_future_is_refused(foreign, tmp_path):
    private, key = new_key()
    foreign["entries"][5]["ts"] = "2999-01-01T00:00:00.000000Z"
    refuses(write(tmp_path, resign(foreign, private, key)), "entry 6 is dated 2999.*has not come yet")


def test_nothing_local_writes_to_an_imported_run(agent, settings, tmp_path):
    """Finding 2: an export taken while a call was held has a `call` with no `result`; the stale-step job
    appended "Recorder stopped" to the imported copy, signed it here, and broke its verification."""

    def held_at_export():
        make_run(agent, steps=2, run_key="run:held")
        services.open_step(
            agent=agent,
            run_key="run:held",
            server=None,
            server_name="crm",
            tool="update_deal",
            arguments={"deal_id": "D-9"},
            request_meta=None,
            now=timezone.now(),
            decide=lambda declaration, retry_of=None: {"decision": "ask", "reason": "irreversible"},
        )
        return agent.runs.get(key="run:held")

    bundle = foreign_bundle(settings, tmp_path, held_at_export)
    call_command("import_run", str(write(tmp_path, bundle)), stdout=open("/dev/null", "w"))
    imported = Run.objects.get()
    before = (
        imported.head_seq,
        imported.head_hash,
        imported.state,
        list(imported.steps.values_list("status")),
    )
    assert imported.steps.get(number=3).status == Step.Status.HELD
    far_future = timezone.now() + timedelta(days=30)
    assert services.reconcile_stale_steps(older_than=far_future, now=far_future) == 0
    with pytest.raises(services.ForeignRun):
        services.record_event(run_id=imported.pk, event="plan", data={}, now=timezone.now())
    assert services.checkpoint_run(run=imported) is None
    from approver.services import PlanRefused, request_plan
    from tests.conftest import _persona

    with pytest.raises(PlanRefused, match="imported from https://undo.other.example"):
        request_plan(run=imported, requested_by=_persona("olga", "on-call"), reason="x", from_step=1)
    imported.refresh_from_db()
    assert (
        imported.head_seq,
        imported.head_hash,
        imported.state,
        list(imported.steps.values_list("status")),
    ) == before
    assert verify(imported)[0] == 0


@pytest.mark.parametrize("kind", ["bundle", "chronomcp"])
def test_ending_an_imported_run_from_its_page_is_refused_and_writes_nothing(
    foreign, tmp_path, client, on_call, kind
):
    source = write(tmp_path, foreign) if kind == "bundle" else FIXTURES / "chronomcp-audit.jsonl"
    call_command("import_run", str(source), stdout=open("/dev/null", "w"))
    imported = Run.objects.get()
    head = (imported.head_seq, imported.head_hash)
    client.force_login(on_call)
    answer = client.post(f"/runs/{imported.public_id}/end/", follow=True)
    assert answer.status_code == 200 and b"This run was imported: nothing here changes it." in answer.content
    imported.refresh_from_db()
    assert (imported.head_seq, imported.head_hash) == head and imported.ended_at is None


def test_a_bundle_nested_too_deep_or_too_large_is_refused_before_it_is_parsed(db, tmp_path, settings):
    """Finding 9: a bundle nested 100,000 deep made `import_run` print a traceback."""
    path = tmp_path / "deep.json"
    path.write_text('{"format": "agent-undo/run-bundle@1", "run": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refuses(path, "nests 100001 levels deep; the limit is 72")
    settings.RECORDER_IMPORT_MAX_BYTES = 1000
    path.write_text(json.dumps({"format": "agent-undo/run-bundle@1", "pad": "x" * 2000}))
    refuses(path, "2048 bytes; the limit is 1000")


def test_a_bundle_that_is_not_json_is_refused(db, tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": ')
    refuses(path, "not JSON|line 1")


def test_the_same_bundle_twice_is_refused(foreign, tmp_path):
    call_command("import_run", str(write(tmp_path, foreign)), stdout=open("/dev/null", "w"))
    refuses(write(tmp_path, foreign), "already here")


def test_this_recorders_own_run_is_already_here(run, tmp_path):
    refuses(export(run, tmp_path), "already here")


@pytest.mark.postgres  # jsonb gives its 1e21 back as an integer: it must verify there too
def test_a_chronomcp_audit_log_imports_after_its_own_chain_verifies(db):
    call_command("import_run", str(FIXTURES / "chronomcp-audit.jsonl"), stdout=open("/dev/null", "w"))
    run = Run.objects.get()
    assert run.agent_label == "chronomcp" and run.state == "imported"
    assert list(run.steps.values_list("tool", flat=True)) == [
        "create_record", "create_record", "send_email", "delete_record"]
    assert run.unknown_count == 4
    assert verify(run)[0] == 0
    assert run.entries.get(seq=1).data["agent"] == "chronomcp" and run.entries.get(seq=2).event == "imported"
    assert run.entries.get(seq=4).data["entry"]["data"]["args"]["name"] == "Globex — kickoff ✓"


@pytest.mark.parametrize(
    ("line", "edit", "pattern"),
    [
        (2, lambda e: e["data"]["args"].update(name="Globex"), "line 2: content does not match"),
        (3, lambda e: e.update(prevHash="0" * 64), "line 3: prevHash"),
        (1, lambda e: e.update(kind=7), "line 1: kind"),
        (4, lambda e: e.pop("data"), "line 4: data"),
    ],
)
def test_a_tampered_or_malformed_chronomcp_log_is_refused_whole(db, tmp_path, line, edit, pattern):
    lines = (FIXTURES / "chronomcp-audit.jsonl").read_text().split("\n")
    entry = json.loads(lines[line - 1])
    edit(entry)
    lines[line - 1] = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
    path = tmp_path / "audit.jsonl"
    path.write_text("\n".join(lines))
    refuses(path, pattern)


def test_a_removed_chronomcp_line_is_refused(db, tmp_path):
    lines = (FIXTURES / "chronomcp-audit.jsonl").read_text().split("\n")
    path = tmp_path / "audit.jsonl"
    path.write_text("\n".join(lines[:2] + lines[3:]))
    refuses(path, "line 3: prevHash")


@pytest.mark.postgres  # jsonb keeps 1e21's value, not its form: a step's JSON must give the float back
def test_a_steps_json_gives_its_floats_back_on_every_database(run):
    floats = {"big": 1e21, "below": [-1e22, 1e-7], "safe": 2**53 - 1}
    step = run.steps.order_by("number").first()
    Step.objects.filter(pk=step.pk).update(arguments=floats, result={"value": floats},
                                           compensation_arguments=floats, earlier_state={"read": floats})
    step = Step.objects.get(pk=step.pk)
    assert step.arguments == floats and type(step.arguments["big"]) is float
    assert step.compensation_arguments == floats and step.result == {"value": floats}
    assert type(step.earlier_state["read"]["below"][0]) is float


@pytest.mark.postgres
def test_an_entry_with_floats_beyond_two_to_the_53_verifies_as_it_was_appended(run):
    """An entry's data is stored as its JCS text, which writes the float 1e20 as 100000000000000000000: read
    back, it is the float again, so the chain verifies (the agent-meta fuzz found it)."""
    floats = {"x": 1e20, "y": 1e21, "z": [-1.5e300, 2.0**60, 0.5], "safe": 2**53 - 1}
    services.record_event(run_id=run.pk, event="check", data=floats, now=timezone.now())
    assert services.verify_run(run=run).ok
    entry = run.entries.order_by("-seq").first()
    assert entry.data == floats and type(entry.data["x"]) is float and type(entry.data["safe"]) is int
