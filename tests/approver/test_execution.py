"""Executing a plan, as pure decisions: outcomes, safe retries, and what a failure stops."""

import pytest

from approver import execution as ex


def test_a_hatp_compensation_that_worked_keeps_the_servers_words():
    verdict = ex.read_answer({"content": [{"type": "text", "text": "Undone."}],
                              "structuredContent": {"ok": True, "summary": "Deal D-881 stage: Won → Proposal",
                                                    "version": "v15"}})
    assert verdict == ex.Verdict(
        "compensated", {"summary": "Deal D-881 stage: Won → Proposal", "version": "v15"}
    )


def test_a_conflict_leaves_the_newer_change_and_says_who_made_it():
    verdict = ex.read_answer({"isError": True, "content": [{"type": "text", "text": "changed"}],
                              "structuredContent": {"code": "UNDO_CONFLICT", "current": {
                                  "version": "v16", "changedBy": "priya", "changedAt": "t", "summary": "s",
                                  "extra": "dropped"}}})
    assert verdict.outcome == "conflict" and not verdict.retry
    assert verdict.detail["current"] == {
        "version": "v16",
        "summary": "s",
        "changedBy": "priya",
        "changedAt": "t",
    }


@pytest.mark.parametrize(
    "result",
    [
        {"isError": True, "structuredContent": {"code": "UNDO_EXPIRED"}},
        {
            "isError": True,
            "structuredContent": {"code": "UNDO_FAILED"},
            "content": [{"type": "text", "text": "no"}],
        },
        {"isError": True, "structuredContent": "garbage"},
        {"isError": True},
    ],
)
def test_refusals_and_nonsense_fail_the_item_without_a_retry(result):
    verdict = ex.read_answer(result)
    assert verdict.outcome == "compensation_failed" and not verdict.retry and verdict.detail["message"]


def test_a_transient_failure_before_sending_is_retried_with_backoff():
    verdict = ex.read_failure(
        failure_class="transient",
        message="refused",
        transient=True,
        may_have_acted=False,
        repeat_is_safe=False,
        attempt=1,
    )
    assert verdict.retry and [ex.backoff(n) for n in (1, 2, 3)] == [1.0, 4.0, 16.0]
    last = ex.read_failure(failure_class="transient", message="refused", transient=True, may_have_acted=False,
                           repeat_is_safe=False, attempt=ex.MAX_ATTEMPTS)
    assert last.outcome == "compensation_failed" and not last.retry


def test_a_server_that_may_have_acted_is_never_repeated_blindly():
    verdict = ex.read_failure(failure_class="transient", message="did not answer in time", transient=True,
                              may_have_acted=True, repeat_is_safe=False, attempt=1)
    assert verdict.outcome == "outcome_unknown" and not verdict.retry
    assert "may have acted" in verdict.detail["message"]
    # When the server honours the idempotency key, a repeat returns the first outcome: it is safe to retry.
    safe = ex.read_failure(failure_class="transient", message="did not answer in time", transient=True,
                           may_have_acted=True, repeat_is_safe=True, attempt=1)
    assert safe.retry
    # Out of attempts, the last timeout still leaves nobody knowing whether it acted.
    last = ex.read_failure(failure_class="transient", message="did not answer in time", transient=True,
                           may_have_acted=True, repeat_is_safe=True, attempt=ex.MAX_ATTEMPTS)
    assert last.outcome == "outcome_unknown" and not last.retry


def test_a_permanent_failure_fails_the_item():
    verdict = ex.read_failure(failure_class="permission", message="forbidden", transient=False,
                              may_have_acted=False, repeat_is_safe=True, attempt=1)
    assert verdict.outcome == "compensation_failed" and not verdict.retry


def test_items_without_a_compensation_have_their_own_outcomes():
    assert ex.without_compensation("cannot_undo", "sent").outcome == "irreversible"
    assert ex.without_compensation("nothing_to_undo", "a read").outcome == "no_compensation"
    assert ex.without_compensation("already_undone", "earlier plan").outcome == "already_undone"


def test_a_failure_stops_what_its_step_depends_on_and_nothing_else():
    earlier = [1, 2, 3, 4]
    # Step 4 declared it used step 2 only; step 3 declared nothing (so it used everything before it).
    failed = {4: ex.depends_on(4, earlier=earlier, declared=(2,), inferred=set())}
    assert (
        ex.stopped_by(2, failed) == 4
        and ex.stopped_by(3, failed) is None
        and ex.stopped_by(1, failed) is None
    )
    failed[3] = ex.depends_on(3, earlier=earlier, declared=None, inferred=set())
    assert ex.stopped_by(1, failed) == 3


def test_the_summary_line_reads_like_the_report():
    outcomes = ["irreversible", "compensated", "compensated", "no_compensation"]
    assert ex.summary_line(outcomes) == "Reversed 2 of 2 actions; 1 cannot be undone"
    assert ex.summary_line(["conflict", "skipped", "outcome_unknown"]) == (
        "Reversed 0 of 3 actions; 1 left alone: changed since; 1 need a human to check; 1 skipped")


def test_what_an_earlier_plan_undid_is_named_apart_and_does_not_count_against_the_plan():
    outcomes = ["compensated", "irreversible", *["already_undone"] * 4]
    assert (
        ex.summary_line(outcomes)
        == "Reversed 1 of 1 action; 1 cannot be undone; 4 already undone by an earlier plan"
    )
    assert ex.finished_state(outcomes, stopped=False) == "completed"
    assert ex.finished_state(["already_undone", "irreversible"], stopped=False) == "completed"
    assert (
        ex.finished_state(["compensated", "skipped", "already_undone"], stopped=False)
        == "partially_completed"
    )
    assert ex.finished_state(["compensation_failed", "already_undone"], stopped=False) == "failed"
    assert ex.finished_state(["compensated", "already_undone"], stopped=True) == "partially_completed"
    assert {ex.OUTCOME_WORDS[o] for o in ("already_undone", "compensation_failed")} == {
        "Already undone",
        "Undo failed",
    }


def test_a_recipe_undo_runs_only_on_what_the_agent_left_or_the_version_an_approver_chose():
    assert ex.recipe_before_undo(now="left", agent_left="left", before="was") is None
    assert ex.recipe_before_undo(now="newer", agent_left="left", before="was", overwrite="newer") is None
    assert ex.recipe_before_undo(now="was", agent_left="left", before="was").outcome == "already_undone"
    changed = ex.recipe_before_undo(now="other", agent_left="left", before="was")
    assert changed.outcome == "conflict" and changed.detail["current"] == {"version": "other"}


def test_a_recipe_undo_counts_only_once_the_record_reads_as_before():
    ran = ex.Verdict("compensated", {"summary": "wrote it"})
    assert ex.recipe_after_undo(ran, now="was", before="was").outcome == "compensated"
    failed = ex.recipe_after_undo(ran, now="else", before="was")
    assert failed.outcome == "compensation_failed" and failed.detail["postcondition"] is False
    refused = ex.Verdict("compensation_failed", {"message": "no"})
    assert ex.recipe_after_undo(refused, now="was", before="was") is refused


def test_a_recipe_undo_of_several_calls_that_stops_half_way_says_what_ran_and_is_never_tried_again():
    failed = ex.Verdict(ex.COMPENSATION_FAILED, {"message": "relation type missing"}, retry=True)
    partial = ex.partial_undo(failed, calls=["create_entities", "create_relations"], failed=2)
    assert partial.outcome == ex.COMPENSATION_FAILED and partial.retry is False
    assert partial.detail["partial"] is True
    assert partial.detail["message"] == (
        "The undo is partial: create_entities ran, then create_relations (call 2 of 2) did not: relation "
        "type missing. Finish it by hand.")
