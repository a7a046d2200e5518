"""Every write on the Recorder side, one module per concept; views, tasks, commands and the gateway call
these as `journal.services.X`.

- `agents`: agents and their bearer tokens.
- `agent_sessions`: the records of handshake sessions, which any Recorder process serves them by.
- `servers`: tool servers, their catalogues and their undo recipes.
- `record`: a run's chain and its signed checkpoints.
- `steps`: an agent's call, journaled before it is forwarded and after it returns.
- `in_flight`: steps still in flight: a call its server made a task, and what a stopped Recorder left.
- `bundles`: verify and export a whole run record, import a ChronoMCP log; `imports`: import a bundle.
"""

from .agent_sessions import (
    agent_session,
    forget_agent_session,
    forget_idle_agent_sessions,
    save_agent_session,
    touch_agent_session,
)
from .agents import (
    TOKEN_PREFIX,
    authenticate_agent,
    create_agent,
    hash_token,
    move_agent,
    reset_agent_token,
    team_for,
)
from .bundles import export_bundle, import_chronomcp_log, verify_run, write_bundle
from .earlier_states import read_again
from .imports import import_bundle
from .in_flight import (
    RunningTask,
    opened_again,
    reconcile_stale_steps,
    running_task,
    task_cancelled,
    task_followed,
    task_started,
)
from .record import ForeignRun, append_entry, checkpoint_run, open_run, record_event, step_result
from .runs import RunRefused, end_run, halt_run, release_run, runs_matching
from .servers import (
    RecipesRefused,
    names_too_long,
    prune_capture,
    recipe_problems,
    recipes_record,
    refresh_catalogue,
    register_tool_server,
    save_catalogue,
    save_tool_server,
    set_recipes,
    sweep_capture,
    unrecorded_words,
)
from .steps import (
    READ,
    OpenedStep,
    Outcome,
    adopt_held_task,
    close_step,
    held_step_alive,
    mark_undelivered,
    open_step,
    open_step_in_run,
    prepare_close,
    refuse_step,
    release_held_step,
)

__all__ = [
    "step_result",
    "read_again",
    "agent_session",
    "forget_agent_session",
    "forget_idle_agent_sessions",
    "save_agent_session",
    "touch_agent_session",
    "READ",
    "TOKEN_PREFIX",
    "move_agent",
    "team_for",
    "OpenedStep",
    "Outcome",
    "RunRefused",
    "end_run",
    "halt_run",
    "release_run",
    "runs_matching",
    "ForeignRun",
    "append_entry",
    "open_run",
    "authenticate_agent",
    "checkpoint_run",
    "close_step",
    "prepare_close",
    "create_agent",
    "export_bundle",
    "hash_token",
    "import_bundle",
    "write_bundle",
    "import_chronomcp_log",
    "mark_undelivered",
    "open_step",
    "open_step_in_run",
    "reconcile_stale_steps",
    "RunningTask",
    "opened_again",
    "running_task",
    "task_cancelled",
    "task_started",
    "task_followed",
    "record_event",
    "refresh_catalogue",
    "adopt_held_task",
    "held_step_alive",
    "refuse_step",
    "register_tool_server",
    "release_held_step",
    "reset_agent_token",
    "save_catalogue",
    "save_tool_server",
    "RecipesRefused",
    "names_too_long",
    "prune_capture",
    "sweep_capture",
    "unrecorded_words",
    "recipe_problems",
    "recipes_record",
    "set_recipes",
    "verify_run",
]
