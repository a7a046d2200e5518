"""The regular expressions of undo recipes (`versionPattern`, a `$match` binding's `pattern`,
`whenReadFails.matches`, `refuseIfBefore.matches`), run by RE2 through `google-re2`: in time linear in the
text, whatever the pattern, since the text they run on is the agent's or a server's (a file's content, an
error message). Python's `re` backtracks: `^(\\w+\\s?)*$` against a line of 27 words took seconds, and each
character more doubled it.

RE2 has no backreferences and no look-around, and its `\\w`, `\\d` and `\\s` are ASCII; a pattern it refuses
is refused when the recipe is saved (`problem`), with RE2's own reason. The text is bounded too: a pattern
runs on at most `TEXT_LIMIT` characters, and a longer text matches nothing (a version then cannot be taken,
an error then means nothing the recipe names), so a recipe's read never costs more than one bounded scan."""

import functools
from typing import Any

import re2

PATTERN_LIMIT = 200
TEXT_LIMIT = 1 << 20  # characters
_MEMORY = 8 << 20  # bytes RE2 may use for one compiled pattern


class PatternError(ValueError):
    """A pattern RE2 will not run, with its reason."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # the reason goes to whoever saved the recipe, not to stderr
    options.max_mem = _MEMORY
    return options


@functools.lru_cache(maxsize=512)
def compiled(pattern: str) -> Any:
    """The pattern, compiled by RE2. PatternError says why RE2 refuses it."""
    if not isinstance(pattern, str) or len(pattern) > PATTERN_LIMIT:
        raise PatternError(f"a pattern is a text of at most {PATTERN_LIMIT} characters")
    try:
        return re2.compile(pattern, _options())
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise PatternError(f"{pattern!r} is not a regular expression RE2 runs ({reason}); RE2 has no "
                           "backreferences or look-around") from None


def problem(pattern: Any, *, groups: int | None = None) -> str | None:
    """Why `pattern` cannot be used in a recipe (None when it can): for checking a recipe when it is saved.
    With `groups`, the pattern must capture exactly that many groups."""
    try:
        found = compiled(pattern).groups
    except PatternError as exc:
        return str(exc)
    if groups is not None and found != groups:
        return f"{pattern!r}: the pattern captures exactly {groups} group{'s' if groups != 1 else ''}"
    return None


def search(pattern: str, text: Any) -> Any:
    """RE2's first match of `pattern` in `text` (its `.group(n)` as in `re`), or None: also when `text` is
    not a string, is over `TEXT_LIMIT` characters, or holds a lone surrogate (which no UTF-8 text has)."""
    if not isinstance(text, str) or len(text) > TEXT_LIMIT:
        return None
    try:
        return compiled(pattern).search(text)
    except UnicodeEncodeError:
        return None
