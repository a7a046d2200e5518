"""verify_run, export_run, import_run and rotate_recorder_key against the database."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from journal import keys, services
from journal.models import ChainEntry, Checkpoint, RecorderKey, Run, Step

from .factories import make_run

README = Path(__file__).resolve().parents[2] / "README.md"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def agent(dana):
    agent, _ = services.create_agent(name="sales-bot", on_behalf_of=dana)
    return agent


@pytest.fixture
def run(agent, settings):
    settings.RECORDER_CHECKPOINT_EVERY = 4
    run = make_run(agent, steps=5)  # 10 entries, checkpoints at 4 and 8
    services.checkpoint_run(run=run)  # and at 10
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
    assert "10 entries, 3 signed checkpoints" in output


@pytest.mark.parametrize("seq", range(1, 11))
def test_changing_any_entry_is_found(run, seq):
    ChainEntry.objects.filter(run=run, seq=seq).update(data={"forged": True})
    code, output = verify(run)
    assert code == 1 and f"entry {seq}" in output


@pytest.mark.parametrize("seq", range(1, 11))
def test_removing_any_entry_is_found(run, seq):
    ChainEntry.objects.filter(run=run, seq=seq).delete()
    code, output = verify(run)
    assert code == 1
    expected = seq if seq < 10 else 10
    assert f"entry {expected}" in output


def test_inserting_an_entry_is_found(run):
    # Make room at seq 4 by moving the later entries up, as someone rewriting the table would.
    for entry in ChainEntry.objects.filter(run=run, seq__gte=4).order_by("-seq"):
        ChainEntry.objects.filter(pk=entry.pk).update(seq=entry.seq + 1)
    third = ChainEntry.objects.get(run=run, seq=3)
    from journal import chain

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


def readme_verifier(tmp_path) -> Path:
    block = re.search(r"```python\n(# verify_bundle.py.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "verify_bundle.py"
    script.write_text(block)
    return script


def export(run, tmp_path) -> Path:
    path = tmp_path / "run.json"
    call_command("export_run", str(run.public_id), "-o", str(path), stderr=open("/dev/null", "w"))
    return path


def test_the_readme_verifier_accepts_an_exported_bundle(run, tmp_path):
    result = subprocess.run([sys.executable, readme_verifier(tmp_path), export(run, tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "OK: 10 entries" in result.stdout


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


def test_a_bundle_from_another_recorder_imports_and_verifies(run, tmp_path):
    path = export(run, tmp_path)
    bundle = json.loads(path.read_text())
    bundle["run"]["recorder"] = "https://undo.other.example"
    Run.objects.all().delete()
    RecorderKey.objects.all().delete()
    path.write_text(json.dumps(bundle))
    call_command("import_run", str(path), stdout=open("/dev/null", "w"))
    imported = Run.objects.get()
    assert imported.state == "imported" and imported.imported_from == "https://undo.other.example"
    assert imported.step_count == 5 and Step.objects.filter(run=imported).count() == 5
    assert verify(imported)[0] == 0


def refuses(path, pattern):
    before = (Run.objects.count(), ChainEntry.objects.count(), Step.objects.count(), RecorderKey.objects.count())
    with pytest.raises(CommandError, match=pattern):
        call_command("import_run", str(path))
    after = (Run.objects.count(), ChainEntry.objects.count(), Step.objects.count(), RecorderKey.objects.count())
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
    ],
)
def test_malformed_or_tampered_bundles_are_refused_whole(run, tmp_path, mutate, pattern):
    path = export(run, tmp_path)
    bundle = json.loads(path.read_text())
    bundle["run"]["recorder"] = "https://undo.other.example"
    Run.objects.all().delete()
    mutate(bundle)
    path.write_text(json.dumps(bundle))
    refuses(path, pattern)


def test_a_bundle_that_is_not_json_is_refused(db, tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"format": ')
    refuses(path, "not JSON|line 1")


def test_the_same_bundle_twice_is_refused(run, tmp_path):
    refuses(export(run, tmp_path), "already here")


def test_a_chronomcp_audit_log_imports_after_its_own_chain_verifies(db):
    call_command("import_run", str(FIXTURES / "chronomcp-audit.jsonl"), stdout=open("/dev/null", "w"))
    run = Run.objects.get()
    assert run.agent_label == "chronomcp" and run.state == "imported"
    assert list(run.steps.values_list("tool", flat=True)) == [
        "create_record", "create_record", "send_email", "delete_record"]
    assert run.unknown_count == 4
    assert verify(run)[0] == 0
    assert run.entries.get(seq=3).data["entry"]["data"]["args"]["name"] == "Globex — kickoff ✓"


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
