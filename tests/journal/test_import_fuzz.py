"""import_run against mutated bundles (issue 14): Hypothesis mutates a genuine export of another Recorder, in
its structure (values replaced, keys dropped or added, entries swapped or repeated, strings and numbers
nudged, whole chains forged with another key) and in its text (bytes cut, inserted or changed, keys named
twice, values nested deep, the file truncated). Every result must be a clean refusal that wrote nothing, or
an import that stores exactly what the genuine bundle stores: 0 tracebacks, 0 partial writes, 0 accepted
tampering. `pytest -s` prints the figures."""

import copy
import json
import os
import uuid
from collections import Counter

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import services
from journal.models import ChainEntry, Checkpoint, RecorderKey, Run, Step

from .bundles import OTHER, foreign_bundle, new_key, resign
from .factories import journal_call, make_run

# The same 1,200 bundles every run, so CI is repeatable; IMPORT_FUZZ_EXAMPLES=20000 IMPORT_FUZZ_RANDOM=1
# explores.
EXAMPLES = int(os.environ.get("IMPORT_FUZZ_EXAMPLES", "1200"))
RANDOM = bool(os.environ.get("IMPORT_FUZZ_RANDOM"))

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
                | st.sampled_from(["", "GENESIS", "run", "call", "result", "2099-01-01T00:00:00.000000Z",
                                   "yesterday", OTHER, "http://localhost:8000", "\ud800", "0" * 64]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


@pytest.fixture
def genuine(agent_and_origin, settings, tmp_path):
    """A bundle of another Recorder whose keys are already pinned here (an earlier run of it was imported),
    so a chain re-signed with any other key is a forgery, not a first import."""
    agent = agent_and_origin

    def story():
        journal_call(
            agent,
            run_key="run:fuzz",
            tool="update_deal",
            arguments={"deal_id": "D-881", "n": 2**40},
            result={"content": [{"type": "text", "text": "Won ✓"}], "structuredContent": {"v": [1, 2.5]}},
        )
        journal_call(agent, run_key="run:fuzz", tool="send_email", arguments={"to": "buyer@globex.example"},
                     error=services.Outcome(error_message="mail is down", failure_class="transient"))
        services.open_step(
            agent=agent,
            run_key="run:fuzz",
            server=None,
            server_name="mail",
            tool="send_email",
            arguments={"to": "cto@globex.example"},
            request_meta=None,
            now=timezone.now(),
            decide=lambda declaration, retry_of=None: {"decision": "ask", "reason": "irreversible"},
        )
        return agent.runs.get(key="run:fuzz")

    settings.RECORDER_CHECKPOINT_EVERY = 3
    earlier_and_target = []

    def both():
        earlier = make_run(agent, steps=1, run_key="run:earlier")
        earlier_and_target.append(services.export_bundle(run=earlier))
        Run.objects.filter(pk=earlier.pk).delete()
        return story()

    target = foreign_bundle(settings, tmp_path, both)
    services.import_bundle(text=json.dumps(earlier_and_target[0]))
    return target


@pytest.fixture
def agent_and_origin(dana):
    return services.create_agent(name="sales-bot", on_behalf_of=dana)[0]


def stored() -> dict:
    """What an import of the target wrote: the signed content and everything derived from it."""
    run = Run.objects.exclude(public_id__in=_pinned_runs).first()
    if run is None:
        return {}
    return {
        "run": (
            str(run.public_id),
            run.state,
            run.imported_from,
            run.agent_label,
            run.started_at,
            run.last_activity_at,
            run.head_seq,
            run.head_hash,
            run.checkpointed_seq,
            run.step_count,
            run.reversible_count,
            run.irreversible_count,
            run.unknown_count,
            run.failed_count,
        ),
        "entries": [e.as_wire() for e in run.entries.order_by("seq")],
        "checkpoints": [c.as_wire() for c in run.checkpoints.order_by("seq").select_related("run")],
        "steps": list(
            run.steps.order_by("number").values_list(
                "number",
                "server_name",
                "tool",
                "arguments",
                "status",
                "is_error",
                "result",
                "failure_class",
                "reversibility",
                "started_at",
                "finished_at",
            )
        ),
        # The keys' material; their validity windows are the origin's unsigned claim, checked only for sense.
        "keys": sorted(RecorderKey.objects.values_list("origin", "key_id", "public_key")),
    }


_pinned_runs: list = []


def same_content(got: dict, expected: dict) -> bool:
    """The import stored what the genuine bundle stores. A bundle may leave out a checkpoint before its last
    (the last signs every entry before it), so the checkpoints kept must be genuine ones, the last among
    them."""
    if {k: v for k, v in got.items() if k != "checkpoints"} != {
        k: v for k, v in expected.items() if k != "checkpoints"
    }:
        return False
    kept, genuine = got.get("checkpoints", []), expected["checkpoints"]
    return bool(kept) and all(c in genuine for c in kept) and kept[-1] == genuine[-1]


def counts() -> tuple:
    return tuple(model.objects.count() for model in (Run, ChainEntry, Checkpoint, Step, RecorderKey))


def paths(value, where=()):
    yield where
    if isinstance(value, dict):
        for key, child in value.items():
            yield from paths(child, (*where, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from paths(child, (*where, index))


def parent_of(document, path):
    for step in path[:-1]:
        document = document[step]
    return document


@st.composite
def mutated(draw, bundle: dict) -> tuple[str, str]:
    """(what was done, the bundle's text)."""
    document = copy.deepcopy(bundle)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(["replace", "delete", "insert", "swap", "repeat", "string", "number", "forge"])
        )
        every = [p for p in paths(document) if p]
        path = draw(st.sampled_from(every))
        parent = parent_of(document, path)
        if kind == "replace":
            parent[path[-1]] = draw(json_values)
        elif kind == "delete":
            del parent[path[-1]]
        elif kind == "insert":
            target = parent[path[-1]]
            if isinstance(target, dict):
                target[draw(st.text(max_size=8))] = draw(json_values)
            elif isinstance(target, list):
                target.insert(draw(st.integers(0, len(target))), draw(json_values))
            else:
                kind = "insert (nothing)"
        elif kind in ("swap", "repeat"):
            name = draw(st.sampled_from(["entries", "checkpoints", "publicKeys"]))
            items = document.get(name) if isinstance(document, dict) else None
            if not isinstance(items, list) or not items:
                kind += " (nothing)"
            elif kind == "swap":
                i, j = draw(st.integers(0, len(items) - 1)), draw(st.integers(0, len(items) - 1))
                items[i], items[j] = items[j], items[i]
            else:
                items.insert(draw(st.integers(0, len(items))), copy.deepcopy(draw(st.sampled_from(items))))
        elif kind == "string":
            strings = [p for p in every if isinstance(parent_of(document, p)[p[-1]], str)]
            if strings:
                spot = draw(st.sampled_from(strings))
                text = parent_of(document, spot)[spot[-1]]
                at = draw(st.integers(0, len(text)))
                parent_of(document, spot)[spot[-1]] = (
                    text[:at] + draw(st.text(min_size=1, max_size=2)) + text[at + 1 :]
                )
        elif kind == "number":
            numbers = [p for p in every if type(parent_of(document, p)[p[-1]]) is int]
            if numbers:
                spot = draw(st.sampled_from(numbers))
                parent_of(document, spot)[spot[-1]] += draw(st.sampled_from([-1, 1, 2**53]))
        elif kind == "forge" and isinstance(document, dict) and isinstance(document.get("run"), dict):
            try:  # a consistent chain re-signed by a key the forger holds, with a change to its header
                private, key = new_key(f"rk-forged-{draw(st.integers(0, 9))}")
                change = draw(st.sampled_from([{"agent": "mallory"}, {"onBehalfOf": "mallory"}, {}]))
                run_id = draw(st.sampled_from([None, str(uuid.uuid4())]))
                document = resign(document, private, key, run_id=run_id, **change)
            except (KeyError, TypeError, AttributeError, IndexError, ValueError):
                kind = "forge (not a bundle any more)"
        done.append(kind)
    try:
        text = json.dumps(document, ensure_ascii=draw(st.booleans()))
    except (TypeError, ValueError):
        text = json.dumps(bundle)
    for _ in range(draw(st.integers(0, 2))):
        edit = draw(st.sampled_from(["cut", "insert-bytes", "truncate", "duplicate-key", "deep"]))
        at = draw(st.integers(0, len(text)))
        if edit == "cut":
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif edit == "insert-bytes":
            text = text[:at] + draw(st.text(min_size=1, max_size=4)) + text[at:]
        elif edit == "truncate":
            text = text[:at]
        elif edit == "duplicate-key":
            field = draw(st.sampled_from(['"agent": ', '"recorder": ', '"seq": ', '"hash": ', '"keyId": ']))
            text = text.replace(field, f"{field}{json.dumps(draw(json_scalars))}, {field}", 1)
        else:
            depth = draw(st.sampled_from([70, 1000, 100_000]))
            text = text.replace('"data": ', '"data": ' + "[" * depth + "1" + "]" * depth + ', "x": ', 1)
        done.append(edit)
    return " + ".join(done), text


@pytest.mark.django_db
def test_import_run_refuses_every_tampered_bundle_cleanly_and_writes_nothing(genuine, tmp_path):
    _pinned_runs[:] = list(Run.objects.values_list("public_id", flat=True))
    with transaction.atomic():
        services.import_bundle(text=json.dumps(genuine))
        expected = stored()
        transaction.set_rollback(True)
    assert expected["steps"] and expected["entries"][0]["event"] == "run"
    figures: Counter = Counter()
    reasons: Counter = Counter()
    kinds: Counter = Counter()
    failures: list[str] = []
    path = tmp_path / "bundle.json"

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                     HealthCheck.data_too_large])
    @given(mutated(genuine))
    def attempt(case):
        what, text = case
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        figures["bundles"] += 1
        kinds.update(what.split(" + "))
        with transaction.atomic():
            before = counts()
            try:
                call_command("import_run", str(path), stdout=open("/dev/null", "w"))
            except CommandError as refusal:
                figures["refused"] += 1
                reasons[
                    str(refusal).split(": ", 2)[1][:40] if ": " in str(refusal) else str(refusal)[:40]
                ] += 1
                if counts() != before:
                    figures["partial writes"] += 1
                    failures.append(f"partial write after refusing ({what}): {refusal}")
            except Exception as exc:  # noqa: BLE001 - exactly what this test looks for
                figures["tracebacks"] += 1
                failures.append(f"traceback ({what}): {type(exc).__name__}: {str(exc)[:200]}")
            else:
                if same_content(stored(), expected):
                    figures["accepted, the same as the genuine bundle"] += 1
                else:
                    figures["accepted tampering"] += 1
                    got = stored()
                    failures.append(
                        f"accepted tampering ({what}): {[k for k in expected if got.get(k) != expected[k]]}"
                    )
            transaction.set_rollback(True)

    attempt()
    print("\nimport_run fuzz:", dict(figures))
    print("mutations tried:", dict(kinds))
    print("most common refusals:", reasons.most_common(12))
    assert figures["bundles"] >= 1000
    assert failures == [], "\n".join(failures[:20])
    assert figures["tracebacks"] == figures["partial writes"] == figures["accepted tampering"] == 0
