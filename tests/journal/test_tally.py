"""The run page's header counts every step once, in words a person reads."""

from journal.tally import header, kind


def test_every_step_counts_once_and_held_or_unsent_calls_are_named_for_what_they_are():
    assert header([
        ("ok", "compensate", "", False, 5), ("ok", "read_only", "", False, 1), ("held", "none", "", False, 1),
        ("error", "none", "policy", False, 2), ("error", "compensate", "not_found", False, 1),
        ("undelivered", "compensate", "", True, 1), ("pending", "unknown", "", True, 1),
    ]) == ("12 steps: 6 reversible, 1 read-only, 1 held for approval, 1 in flight, "
           "2 not sent (stopped by a policy), 1 failed, changing nothing")
    assert header([]) == "0 steps" and header([("ok", "none", "", False, 1)]) == "1 step: 1 cannot be undone"


def test_a_failed_call_that_may_have_acted_counts_by_what_undoing_it_takes():
    assert kind(status="error", reversibility="unknown", failure_class="unknown",
                may_have_acted=True) == "unknown"
    assert kind(status="cancelled", reversibility="none", failure_class="", may_have_acted=True) == "none"
