"""A closed step's links to the earlier steps whose results it used, and the index of its own result's
values for the steps after it (docs/design.md: dependent steps, inferred and declared)."""

from typing import Any

from ..models import Run, RunValue, Step, StepDependency
from ..record import journaling, sql
from ..undo import dependencies


def link(run: Run, step: Step, *, wanted, indexed: dict[str, str]) -> list[dict[str, Any]]:
    """Record inferred and declared dependencies of `step` (the run's earlier results that had the
    arguments' distinctive values, `wanted`), and index its result's values (`indexed`) for later steps.
    The caller holds the run's row lock."""
    links: list[dict[str, Any]] = []
    if wanted:
        digests = sorted({d for d, _ in wanted})
        known = {
            value_digest: (step_id, pointer, seen)
            for value_digest, step_id, pointer, seen in sql.all_rows(
                RunValue,
                ("digest", "step_id", "pointer", "seen"),
                f"run_id = %s AND step_id <> %s AND digest IN ({sql.marks(len(digests))})",
                [run.pk, step.pk, *digests],
            )
        }
        found = dependencies.choose_links(wanted, known)
        if found:
            numbers = dict(
                sql.all_rows(Step, ("id", "number"), f"id IN ({sql.marks(len(found))})", list(found))
            )
            StepDependency.objects.bulk_create(
                [
                    StepDependency(
                        step=step, depends_on_id=step_id, rule=StepDependency.Rule.INFERRED, pointers=pointers
                    )
                    for step_id, pointers in found.items()
                ]
            )
            links += [
                {"step": numbers[s], "rule": "inferred", "pointers": p} for s, p in sorted(found.items())
            ]

    wanted_numbers = journaling.declared_dependencies(step.request_meta, before=step.number)
    if wanted_numbers:
        targets = dict(Step.objects.filter(run=run, number__in=wanted_numbers).values_list("number", "pk"))
        StepDependency.objects.bulk_create(
            [
                StepDependency(step=step, depends_on_id=pk, rule=StepDependency.Rule.DECLARED)
                for pk in targets.values()
            ]
        )
        links += [{"step": number, "rule": "declared"} for number in sorted(targets)]

    _index(run, step, indexed)
    return links


def _index(run: Run, step: Step, values: dict[str, str]) -> None:
    """`step` is now the most recent step of the run whose result had each of `values` (digest: pointer)."""
    if not values:
        return
    # One statement however many values: a new value is inserted, a known one moves to this step, seen once
    # more.
    sql.upsert(
        RunValue,
        [
            {"run_id": run.pk, "digest": value_digest, "step_id": step.pk, "pointer": pointer, "seen": 1}
            for value_digest, pointer in sorted(values.items())
        ],
        unique=("run_id", "digest"),
        replace=("step_id", "pointer"),
        increment="seen",
    )
