"""Undo recipes: an admin's undo declaration for a tool whose server declares nothing. No ORM and no clock.

The servers people run (the official filesystem, memory and git servers) say nothing about undoing their
tools, so every call to them is `unknown`. A recipe, attached by an admin to one registered server (never
chosen by what a server says about itself), says it for them:

- what kind of undo the tool has (`compensate`, `none`, `read_only`), with the window, side effect, cost,
  reason and remedy a declaration has, and what the undo does, in words ("restore the file's earlier
  content");
- an optional **earlier-state read**: a read-only tool of the same server, its arguments bound from the call,
  that the Recorder calls on the agent's own upstream session just before it forwards the call, and again
  just after; the **version** is the digest of what it returns (all of its `structuredContent`, or the value
  at `version`, a JSON Pointer), before the call (the state the undo restores) and after it (the state the
  agent left);
- the **compensation**: a tool of the same server, its arguments bound from the call (`$request.body#/…`),
  its result (`$response.body#/…`) or the earlier state (`$before.body#/…`), with `*` for every element of
  an array (`journal.undo.bindings`);
- what a failed read means (`whenReadFails`: the file did not exist yet, so a write created it, and this
  server cannot delete).

A recipe is keyed by the tool's name and the digest of its input schema: when the server's schema for the
tool changes, the recipe no longer applies and the step says so. Where the server declares anything itself
(every source but read-only hints), its declaration stands; a recipe may only make it stricter (`none`, or
"a person must sign"). A recipe's undo needs a person's signature unless the admin says otherwise.
"""

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import jsonpointer
from pydantic import AfterValidator, Field, ValidationError, model_validator

from ..record.canonical import canonical_bytes, sha256_hex
from . import patterns
from .bindings import EACH, MATCH, expression_problem, resolve_arguments
from .database import judging
from .declarations import HIDDEN_TOOLS, Compensation, Cost, UndoDeclaration, Window, _Strict, normalise

SOURCE = "recipe"
_TEXT = 500
# The declarations a recipe may stand in for: none at all, or only hints below every dialect (read-only, and
# SEP-2793's reversibility).
_SILENT_SOURCES = ("none", "annotations.readOnlyHint", "annotations.reversibility")


def schema_digest(tool: Mapping[str, Any] | None) -> str:
    """The SHA-256 of the canonical JSON (RFC 8785) of a tool's input schema, as the server lists it."""
    schema = (tool or {}).get("inputSchema")
    return sha256_hex(schema if schema is not None else {})


class Call(_Strict):
    """A tool of the same server, with each argument a literal or a binding."""

    tool: str = Field(max_length=200)
    arguments: dict[str, Any] = Field(default_factory=dict)


def _regular_expression(value: str) -> str:
    if (problem := patterns.problem(value)) is not None:
        raise ValueError(problem)
    return value


Pattern = Annotated[str, Field(max_length=200), AfterValidator(_regular_expression)]


class WhenReadFails(_Strict):
    """What a failed earlier-state read means, when its error text matches: there was nothing before (a
    file that did not exist), so the call created it, and what that leaves."""

    matches: Pattern
    kind: Literal["none", "read_only"] = "none"
    reason: str = Field(max_length=_TEXT)
    remedy: str | None = Field(None, max_length=_TEXT)


class RefuseIfBefore(_Strict):
    """An earlier state the compensation cannot put back (a binary file read as text): when the value at
    `at` in what was read matches, the call cannot be undone, for `reason`."""

    at: str = Field("", max_length=200)
    matches: Pattern
    reason: str = Field(max_length=_TEXT)
    remedy: str | None = Field(None, max_length=_TEXT)


class Recipe(_Strict):
    tool: str = Field(max_length=200)
    schema_digest: str = Field(alias="schemaDigest", pattern=r"^[0-9a-f]{64}$")
    # `sql`: a database's SQL tool, each call decided by its statements (journal.undo.database)
    kind: Literal["compensate", "none", "read_only", "sql"]
    sql: str | None = Field(None, max_length=200)  # the argument that holds the statements
    # An SQL server's (journal.undo.database): how it cuts a text (`splitting`), whether it keeps its
    # connection between calls, and the functions outside pg_catalog an admin vouches change nothing.
    split: Literal["database", "dbhub"] = "database"
    keeps_connection: bool = Field(False, alias="keepsConnection")
    safe_functions: list[str] = Field(default_factory=list, alias="safeFunctions", max_length=200)
    does: str = Field("", max_length=200)  # the undo, in words
    window: Window = None
    side_effect: str | None = Field(None, alias="sideEffect", max_length=_TEXT)
    cost: Cost | None = None
    reason: str | None = Field(None, max_length=_TEXT)
    remedy: str | None = Field(None, max_length=_TEXT)
    read: Call | None = None
    version: str = Field("", max_length=200)  # a JSON Pointer into the read's structuredContent
    # A regular expression with one group over the text at `version`: the version is of what it captures.
    version_pattern: Pattern | None = Field(None, alias="versionPattern")
    compensation: Call | None = None
    then: list[Call] = Field(default_factory=list, max_length=3)  # further compensating calls, in order
    when_read_fails: WhenReadFails | None = Field(None, alias="whenReadFails")
    refuse_if_before: RefuseIfBefore | None = Field(None, alias="refuseIfBefore")
    # Arrays whose order means nothing (a knowledge graph's entities and observations) are compared as sets.
    version_ignores_order: bool = Field(False, alias="versionIgnoresOrder")
    needs_human: bool = Field(True, alias="needsHuman")
    # The records a call touches besides what its read names, as bindings over its arguments (a relation
    # touches both entities it names): two calls that touch one are known to overlap.
    touches: list[str] = Field(default_factory=list, max_length=4)

    @model_validator(mode="after")
    def _whole(self) -> "Recipe":
        if self.kind == "compensate" and self.compensation is None:
            raise ValueError("a compensating recipe names its compensation")
        if self.kind != "compensate" and (self.compensation is not None or self.then):
            raise ValueError(f"a recipe of kind {self.kind!r} has no compensation")
        if (self.kind == "sql") != (self.sql is not None) or self.kind == "sql" and self.read is not None:
            raise ValueError("a recipe of kind 'sql' names the argument that holds the statements (sql), and "
                             "no other recipe does")
        uses_before = "$before.body" in str([call.arguments for call in self.calls])
        needs_read = (uses_before or self.version or self.version_pattern or self.when_read_fails
                      or self.refuse_if_before)
        if needs_read and self.read is None:
            raise ValueError("the earlier state, its version and a failed read each need an earlier read")
        if self.version:
            try:
                jsonpointer.JsonPointer(self.version)
            except jsonpointer.JsonPointerException as exc:
                raise ValueError(f"version {self.version!r} is not a JSON Pointer: {exc}") from None
        return self

    @property
    def calls(self) -> list[Call]:
        """The compensating calls, in the order they are made."""
        return [self.compensation, *self.then] if self.compensation is not None else []


def parse(raw: Any) -> tuple[Recipe | None, list[str]]:
    """A recipe from its JSON, or why it is not one."""
    try:
        return Recipe.model_validate(raw), []
    except ValidationError as exc:
        return None, [f"{'.'.join(str(p) for p in d['loc']) or '(recipe)'}: {d['msg']}"
                      for d in exc.errors(include_url=False, include_input=False)]


def _tools(catalogue: list[Any]) -> dict[str, Mapping[str, Any]]:
    return {t["name"]: t for t in catalogue if isinstance(t, Mapping) and isinstance(t.get("name"), str)}


def problems(recipe: Recipe, catalogue: list[Any]) -> list[str]:
    """Why `recipe` cannot apply to its server's catalogue (the raw `tools/list`), checked when it is saved
    and whenever the catalogue changes: every tool it names exists and is the server's own, the schema is
    the one it was written for, the read is read-only, and every binding is well formed and names an
    argument the tool declares."""
    tools = _tools(catalogue)
    found: list[str] = []
    tool = tools.get(recipe.tool)
    if tool is None:
        return [f"the server lists no tool {recipe.tool!r}"]
    if schema_digest(tool) != recipe.schema_digest:
        found.append(f"the server's input schema for {recipe.tool} is not the one the recipe was written "
                     f"for (digest {schema_digest(tool)[:12]}…, the recipe's {recipe.schema_digest[:12]}…): "
                     "it no longer applies")
    declared = _fields(recipe, tools)
    if recipe.sql is not None and recipe.sql not in declared["$request.body"][1]:
        found.append(f"{recipe.tool} declares no argument {recipe.sql!r} to hold its statements")
    after = ("$request.body", "$response.body", "$before.body")
    for role, call, sources in (("read", recipe.read, ("$request.body",)),
                                *(("compensation", call, after) for call in recipe.calls)):
        if call is None:
            continue
        if call.tool not in tools or call.tool in HIDDEN_TOOLS:
            found.append(f"the {role} tool {call.tool!r} is not a tool of this server")
        elif role == "read" and ((tools[call.tool].get("annotations") or {}).get("readOnlyHint") is not True):
            found.append(f"the read tool {call.tool!r} does not say it is read-only (readOnlyHint)")
        for name, expression in call.arguments.items():
            if (problem := expression_problem(expression, sources=sources)) is not None:
                found.append(f"{role} argument {name}: {problem}")
            elif (problem := _unknown_field(expression, declared)) is not None:
                found.append(f"{role} argument {name}: {problem}")
    for expression in recipe.touches:
        if not expression.startswith("$request.body#") or (
                problem := expression_problem(expression, sources=("$request.body",))) is not None:
            found.append(f"touches {expression!r}: a binding over the call's arguments ($request.body#/…)")
        elif (problem := _unknown_field(expression, declared)) is not None:
            found.append(f"touches {expression!r}: {problem}")
    return found


def _fields(recipe: Recipe, tools: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[str, set[str]]]:
    """What each binding source may name at its top level, as the tools' schemas declare it: the call's
    arguments, its result's fields (when it has an output schema), what the read returns (likewise)."""
    def properties(tool_name: str | None, schema: str) -> set[str]:
        declared = (tools.get(tool_name or "") or {}).get(schema) or {}
        return set((declared.get("properties") or {}).keys()) if isinstance(declared, Mapping) else set()

    return {"$request.body": (f"{recipe.tool} declares no argument", properties(recipe.tool, "inputSchema")),
            "$response.body": (f"{recipe.tool}'s result declares no field",
                               properties(recipe.tool, "outputSchema")),
            "$before.body": (f"{recipe.read.tool if recipe.read else 'the read'}'s result declares no field",
                             properties(recipe.read.tool if recipe.read else None, "outputSchema"))}


def _unknown_field(expression: Any, declared: Mapping[str, tuple[str, set[str]]]) -> str | None:
    """Why a binding names a top-level field its source's schema does not declare (None when it does, or
    when the schema says nothing)."""
    if isinstance(expression, dict):
        expression = expression.get(EACH) or expression.get(MATCH)
    if not isinstance(expression, str) or "#/" not in expression:
        return None
    source, _, pointer = expression.partition("#")
    words, fields = declared.get(source, ("", set()))
    first = jsonpointer.JsonPointer(pointer).parts[0]
    return f"{words} {first!r}" if fields and first not in fields else None


def declare(recipe: Recipe, tool: Mapping[str, Any] | None, catalogue: list[Any]) -> UndoDeclaration:
    """The declaration a recipe makes for one call of its tool (`unknown`, saying why, when it no longer
    applies to the server's catalogue)."""
    found = problems(recipe, catalogue)
    if found or recipe.kind == "sql":  # a database's SQL: each call is decided by its statements, read first
        return UndoDeclaration(kind="unknown", source=SOURCE, problems=tuple(found) or (
            f"its statements were not read before the call ({recipe.tool} takes them in {recipe.sql!r})",))
    compensation = Compensation(
        tool=recipe.compensation.tool, dialect="recipe", bindings=dict(recipe.compensation.arguments),
        then=tuple({"tool": call.tool, "bindings": dict(call.arguments)} for call in recipe.then),
    ) if recipe.compensation else None
    return UndoDeclaration(
        kind=recipe.kind, source=SOURCE, via="api" if recipe.kind == "compensate" else None,
        window=recipe.window, side_effect=recipe.side_effect, cost=recipe.cost, reason=recipe.reason,
        remedy=recipe.remedy, compensation=compensation,
        needs_human=recipe.needs_human and recipe.kind == "compensate")


def combine(server: UndoDeclaration, recipe: Recipe | None, tool: Mapping[str, Any] | None,
            catalogue: list[Any]) -> UndoDeclaration:
    """What decides a call of a tool with a recipe: the recipe where the server is silent; where it
    declares, the server, made stricter by the recipe if the recipe is stricter (`none`, or a person must
    sign), never more permissive."""
    if recipe is None:
        return server
    if server.source in _SILENT_SOURCES:
        return declare(recipe, tool, catalogue)
    if recipe.kind == "none":
        reason = recipe.reason or f"An admin's recipe says {recipe.tool} cannot be undone automatically."
        return UndoDeclaration(kind="none", source=SOURCE, reason=reason,
                               remedy=recipe.remedy or server.remedy, side_effect=server.side_effect)
    if recipe.needs_human and server.kind == "compensate" and not server.needs_human:
        return server.model_copy(update={"needs_human": True})
    return server


def declaration_for(tool: Mapping[str, Any] | None, *, catalogue: Any, recipe: Any = None,
                    listing: Any = (), call_journal: Any = None, earlier: Any = None) -> UndoDeclaration:
    """What decides a call's undo: the server's own declarations (`declarations.normalise`), and an admin's
    recipe where the server is silent, or to make it stricter (`combine`), with what its read of the record
    found just before the call (`earlier`, `with_earlier_state`); a malformed recipe leaves the call
    `unknown`, saying why. `listing` is the server's whole catalogue, which the recipe is checked against."""
    server = normalise(tool or {}, catalogue=catalogue, call_journal=call_journal)
    if recipe is None:
        return server
    parsed, found = parse(recipe)
    if parsed is None:
        return UndoDeclaration(kind="unknown", source=SOURCE,
                               problems=tuple(f"its recipe is malformed: {problem}" for problem in found))
    declared = combine(server, parsed, tool, list(listing))
    if parsed.kind == "sql" and declared.source == SOURCE and earlier and not problems(parsed, list(listing)):
        return judging.from_state(earlier)  # what the statements would do, read just before the call
    return with_earlier_state(declared, parsed, earlier) if earlier is not None else declared


def version(read_result: Any, pointer: str = "", *, ignore_order: bool = False, pattern: str | None = None
            ) -> str:
    """The version of an earlier-state read's answer: the digest of its `structuredContent` (or of the value
    at `pointer` in it; with `ignore_order`, every array taken as a set; with `pattern`, of what its group
    captures in that text). Raises ValueError when the answer has no such value."""
    if not isinstance(read_result, Mapping) or read_result.get("isError") is True:
        raise ValueError("the read failed")
    structured = read_result.get("structuredContent")
    if structured is None:  # a server with no output schema answers in text: the version is of the text
        texts = [block.get("text") for block in read_result.get("content") or []
                 if isinstance(block, Mapping) and block.get("type") == "text"]
        if pointer or not texts or not all(isinstance(text, str) for text in texts):
            raise ValueError("the read returned no structuredContent")
        structured = "\n".join(texts)
    try:
        value = jsonpointer.resolve_pointer(structured, pointer)
    except jsonpointer.JsonPointerException as exc:
        raise ValueError(f"the read's answer has no value at {pointer!r} ({exc})") from None
    if pattern:
        found = patterns.search(pattern, value)
        if found is None:
            raise ValueError(f"the read's answer does not match {pattern!r}")
        value = found.group(1)
    return "sha256:" + sha256_hex(_unordered(value) if ignore_order else value)


def _unordered(value: Any) -> Any:
    if isinstance(value, list):
        return sorted((_unordered(item) for item in value), key=canonical_bytes)
    if isinstance(value, Mapping):
        return {key: _unordered(item) for key, item in value.items()}
    return value


def unrestorable(recipe: Recipe, before: Any) -> RefuseIfBefore | None:
    """The rule that makes this earlier state one the compensation cannot put back, if any (the earlier
    state is the read's `structuredContent`)."""
    rule = recipe.refuse_if_before
    if rule is None:
        return None
    try:
        value = jsonpointer.resolve_pointer(before, rule.at)
    except jsonpointer.JsonPointerException:
        return None
    return rule if patterns.search(rule.matches, value) else None


CheckState = Literal["ok", "undone", "conflict", "unchanged"]


def three_state(*, before: str, after: str, now: str) -> CheckState:
    """A recipe undo's check against the state read now: what the agent left → the undo would work; what
    was there before the call → it is undone already; anything else → someone changed it since. A call
    that left the state as it found it (an edit's dry run) has nothing to undo."""
    if before == after:
        return "unchanged"
    if now == after:
        return "ok"
    if now == before:
        return "undone"
    return "conflict"


def failed_read(recipe: Recipe, error_text: str) -> WhenReadFails | None:
    """What a failed earlier-state read means, if the recipe says (else the call is `unknown`)."""
    rule = recipe.when_read_fails
    return rule if rule is not None and patterns.search(rule.matches, error_text or "") else None


def explain(tool: Mapping[str, Any], raw_recipe: Any, catalogue: list[Any]) -> tuple[str, str]:
    """Where a tool's undo comes from, and what it is, in words: (kind, "why"), for the admin's listing."""
    server = normalise(tool, catalogue=[t.get("name") for t in catalogue if isinstance(t, Mapping)])
    recipe, parse_problems = parse(raw_recipe) if raw_recipe is not None else (None, [])
    if raw_recipe is not None and recipe is None:
        return "unknown", "its recipe is malformed: " + "; ".join(parse_problems)
    decided = combine(server, recipe, tool, catalogue)
    if decided.source == SOURCE:
        if decided.problems:
            return decided.kind, "its recipe does not apply: " + "; ".join(decided.problems)
        words = recipe.does or recipe.reason or ""
        return decided.kind, "an admin's recipe" + (f": {words}" if words else "")
    if server.source == "none":
        return "unknown", "its server says nothing about undoing it, and it has no recipe"
    if server.source == "annotations.readOnlyHint":
        return "read_only", "its server says it only reads (readOnlyHint)"
    if server.source == "annotations.reversibility":
        return server.kind, (server.reason or "; ".join(server.problems)) + " (a hint; no recipe)"
    stricter = " (made stricter by a recipe: a person signs)" if decided.needs_human and recipe else ""
    return decided.kind, f"its server's own declaration ({server.source}){stricter}"


# -- the earlier state: read by the Recorder just before a call, and again just after -----------------------


def applying(raw: Any, tool: Mapping[str, Any] | None, listing: Any) -> Recipe | None:
    """The recipe in force for a call, if it parses and fits its server now."""
    recipe, found = parse(raw) if raw is not None else (None, ["no recipe"])
    if recipe is None or problems(recipe, list(listing)):
        return None
    return recipe


def read_arguments(recipe: Recipe, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The earlier-state read's arguments, bound from the call's. BindingError says why not."""
    return resolve_arguments(recipe.read.arguments, dialect="recipe", request=dict(arguments), response=None)


def earlier_state(recipe: Recipe, *, arguments: dict[str, Any], result: Any = None, error: str = "",
                  limit: int, touches: list[Any] | None = None) -> dict[str, Any]:
    """What the step keeps of the read made just before the call: the read (tool and arguments), its
    version, size and digest, and the answer's `structuredContent` when it is within `limit` bytes;
    `problem` says why the recipe cannot undo the call from it."""
    # How to read it again, and compare (the plan's check and its execution read it again the same way).
    state: dict[str, Any] = {"tool": recipe.read.tool, "arguments": arguments, "versionAt": recipe.version,
                             "ignoreOrder": recipe.version_ignores_order, "does": recipe.does,
                             **({"versionPattern": recipe.version_pattern} if recipe.version_pattern else {}),
                             **({"touches": touches} if touches else {})}
    if error or not isinstance(result, Mapping) or result.get("isError") is True:
        text = error or " ".join(str(block.get("text", "")) for block in (result or {}).get("content") or []
                                 if isinstance(block, Mapping))
        return {**state, "error": text[:_TEXT]}
    body = canonical_bytes(result)
    state.update(size=len(body), sha256=sha256_hex(result))
    try:
        state["version"] = version(result, recipe.version, ignore_order=recipe.version_ignores_order,
                                   pattern=recipe.version_pattern)
    except ValueError as exc:
        return {**state, "problem": f"the earlier state could not be versioned: {exc}"}
    structured = kept_state(result, len(body))  # its structuredContent, or its text
    if len(body) > limit:
        return {**state, "problem": f"the earlier state is {len(body)} bytes, over the {limit} kept, so it "
                                    "cannot be put back"}
    return {**state, "structured": structured}


def kept_state(result: Any, limit: int) -> Any:
    """What a read returned (its `structuredContent`, or its text), to show how a record changed; None when
    it is over `limit` bytes or there is nothing to keep."""
    if not isinstance(result, Mapping) or result.get("isError") is True:
        return None
    kept = result.get("structuredContent")
    if kept is None:
        texts = [block.get("text") for block in result.get("content") or []
                 if isinstance(block, Mapping) and block.get("type") == "text"]
        kept = "\n".join(text for text in texts if isinstance(text, str)) if texts else None
    return kept if kept is not None and len(canonical_bytes(kept)) <= limit else None


def with_earlier_state(declaration: UndoDeclaration, recipe: Recipe,
                       state: Mapping[str, Any]) -> UndoDeclaration:
    """The call's declaration once its earlier state was read (or could not be): a failed read means what
    the recipe says (a file that did not exist) or leaves the call `unknown`; an earlier state the recipe
    cannot put back makes it `none`."""
    if declaration.source != SOURCE or declaration.kind != "compensate":
        return declaration
    if "error" in state:
        if (rule := failed_read(recipe, state["error"])) is not None:
            return UndoDeclaration(kind=rule.kind, source=SOURCE, reason=rule.reason, remedy=rule.remedy)
        return UndoDeclaration(kind="unknown", source=SOURCE, problems=(
            f"the earlier state could not be read ({state['error']}), so the call's undo is not known",))
    if "structured" in state and (rule := unrestorable(recipe, state["structured"])) is not None:
        return UndoDeclaration(kind="none", source=SOURCE, reason=rule.reason, remedy=rule.remedy)
    if state.get("problem"):  # read, but not kept or not versioned: the recipe cannot put it back
        return UndoDeclaration(kind="none", source=SOURCE, reason=f"{state['problem'][0].upper()}"
                               f"{state['problem'][1:]}.", remedy=declaration.remedy)
    if state.get("version") and declaration.compensation is not None:  # checked against versions
        return declaration.model_copy(update={
            "compensation": declaration.compensation.model_copy(update={"versioned": True})})
    return declaration
