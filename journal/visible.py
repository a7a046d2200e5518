"""What a person is shown for signing, made to show what it is. No ORM and no clock.

An agent and a tool server choose the words an approver reads (a tool name, an email's subject and body, a
server's reason) and can hide things in them: invisible TAG characters carrying a sentence, a right-to-left
override turning an address around, a Cyrillic "о" in a domain, a subject padded with spaces until the rest
is off the screen. `reveal` finds them all, so every page and message can show each hidden character as
⟨U+202E⟩, a long run of spaces as ⟨400 spaces⟩, and the letters of another script inside a word marked, and
say in words that the value is not what it seems. What is signed, journaled and sent keeps the exact bytes:
only what is shown changes.
"""

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

from confusable_homoglyphs import categories

# Drawn as nothing, or change how what follows is drawn: controls (but the line breaks and tabs of
# multi-line text), formatting (bidirectional controls, zero-width characters, TAG characters), private use,
# unassigned, the line and paragraph separators.
_HIDDEN_CATEGORIES = {"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp"}
_KEPT_CONTROLS = {"\n", "\t"}
# Letters that draw nothing (Hangul fillers, the blank braille pattern) and variation selectors.
_BLANK_LETTERS = {"\u115f", "\u1160", "\u3164", "\uffa0", "\u2800"}
SPACE_RUN = 8  # this many spaces in a row, after other text on the line, are counted, not drawn
_SPACES = re.compile(rf"(?<=[^ \n]) {{{SPACE_RUN},}}")
_WORD = re.compile(r"\w+")
# Scripts that are one writing system together (Japanese mixes these in one word).
_SAME_SYSTEM = {"HIRAGANA": "HAN", "KATAKANA": "HAN", "HANGUL": "HAN"}
_NEUTRAL_SCRIPTS = {"COMMON", "INHERITED"}


_TAG_BASE = 0xE0000  # TAG characters (U+E0000–U+E007F) spell ASCII invisibly: U+E0041 is a hidden "A"
_TAGS = "TAG characters U+E0000–U+E007F (invisible text)"


def _is_tag(char: str) -> bool:
    return _TAG_BASE <= ord(char) <= _TAG_BASE + 0x7F


def is_hidden(char: str) -> bool:
    """Whether `char` is drawn as nothing or as something else than itself (a space that is not U+0020)."""
    if char in _KEPT_CONTROLS:
        return False
    code = ord(char)
    category = unicodedata.category(char)
    return (
        category in _HIDDEN_CATEGORIES
        or (category == "Zs" and char != " ")
        or char in _BLANK_LETTERS
        or 0xFE00 <= code <= 0xFE0F
        or 0xE0100 <= code <= 0xE01EF
    )


# Controls have no Unicode name: the ones that turn up in text, by their usual names.
_CONTROL_NAMES = {"\x00": "NULL", "\x08": "BACKSPACE", "\x0b": "LINE TABULATION", "\x0c": "FORM FEED",
                  "\r": "CARRIAGE RETURN", "\x1b": "ESCAPE", "\x7f": "DELETE", "\x85": "NEXT LINE"}


def describe(char: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`"""
    name = unicodedata.name(char, "") or _CONTROL_NAMES.get(char) or (
        "CONTROL CHARACTER" if unicodedata.category(char) == "Cc" else "UNNAMED CHARACTER")
    return f"U+{ord(char):04X} {name}"


@dataclass(frozen=True)
class Piece:
    """A stretch of the value as shown: `text` to draw, and what it stands for when it is not plain text
    (`kind` "hidden", "spaces" or "script", with `title` saying what it is)."""

    text: str
    kind: str = ""
    title: str = ""


@dataclass(frozen=True)
class Revealed:
    pieces: tuple[Piece, ...]
    hidden: tuple[str, ...]  # each hidden character found, described, once
    mixed: tuple[str, ...]  # each word that mixes scripts, with the scripts: "gооgle (Latin and Cyrillic)"
    padded: int  # the longest run of spaces counted, 0 if none

    @property
    def flags(self) -> list[str]:
        """What is wrong with the value, in words, for the flag beside it."""
        flags = []
        if self.hidden:
            count = len(self.hidden)
            flags.append(f"{count} kind{'s' if count != 1 else ''} of hidden character shown as ⟨U+…⟩: "
                         + ", ".join(self.hidden[:5]) + (", …" if count > 5 else ""))
        if self.mixed:
            flags.append("letters of different scripts in one word: " + "; ".join(self.mixed[:5]))
        if self.padded:
            flags.append(f"padded with {self.padded} spaces in a row")
        return flags

    @property
    def text(self) -> str:
        """The value as plain text, with each hidden character and run of spaces written out."""
        return "".join(piece.text for piece in self.pieces)


def _script(char: str) -> str:
    try:
        script = categories.alias(char)
    except Exception:  # noqa: BLE001 - a character the library's tables do not know: no script to compare
        return "COMMON"
    return _SAME_SYSTEM.get(script, script)


def _mixed_words(value: str) -> tuple[dict[int, str], list[str]]:
    """The positions of letters in a word of another script than most of the word's (with their scripts),
    and the words that mix scripts, described."""
    marked: dict[int, str] = {}
    words: list[str] = []
    for match in _WORD.finditer(value):
        scripts = [(index, _script(char)) for index, char in enumerate(match.group(), start=match.start())]
        counts = Counter(script for _, script in scripts if script not in _NEUTRAL_SCRIPTS)
        if len(counts) < 2:
            continue
        main = counts.most_common(1)[0][0]
        marked.update((index, script) for index, script in scripts
                      if script not in _NEUTRAL_SCRIPTS and script != main)
        names = " and ".join(script.title() for script, _ in counts.most_common())
        words.append(f"“{match.group()}” ({names})")
    return marked, words


def reveal(value: str) -> Revealed:
    """`value` as it must be shown for signing (see the module)."""
    marked, mixed = _mixed_words(value)
    spaces = {match.start(): match.end() for match in _SPACES.finditer(value)}
    pieces: list[Piece] = []
    hidden: dict[str, None] = {}
    plain: list[str] = []
    padded = 0
    index = 0

    def flush():
        if plain:
            pieces.append(Piece("".join(plain)))
            plain.clear()

    while index < len(value):
        char = value[index]
        if index in spaces:
            flush()
            run = spaces[index] - index
            padded = max(padded, run)
            pieces.append(Piece(f" ⟨{run} spaces⟩ ", "spaces", f"{run} spaces in a row"))
            index = spaces[index]
            continue
        if _is_tag(char):  # invisible text: said as the text it spells
            flush()
            end = index
            while end < len(value) and _is_tag(value[end]):
                end += 1
            spelled = "".join(chr(ord(tag) - _TAG_BASE) for tag in value[index:end]
                              if 0x20 <= ord(tag) - _TAG_BASE <= 0x7E)
            hidden[_TAGS] = None
            pieces.append(Piece(f"⟨hidden text: “{spelled}”⟩", "hidden", _TAGS))
            index = end
            continue
        if is_hidden(char):
            flush()
            hidden[describe(char)] = None
            pieces.append(Piece(f"⟨U+{ord(char):04X}⟩", "hidden", describe(char)))
        elif index in marked:
            flush()
            pieces.append(Piece(char, "script", f"{describe(char)} ({marked[index].title()})"))
        else:
            plain.append(char)
        index += 1
    flush()
    return Revealed(pieces=tuple(pieces), hidden=tuple(hidden), mixed=tuple(mixed), padded=padded)


def plain(value: str) -> str:
    """`value` for a message in plain text (an email, a webhook, a subject): hidden characters and runs of
    spaces written out, and what is wrong with it said first, briefly (so cutting a long value never cuts
    the warning)."""
    revealed = reveal(value)
    if not revealed.flags:
        return value
    said = (["hidden characters written out as ⟨U+…⟩"] if revealed.hidden else []) + (
        [f"mixed scripts in {', '.join(word.split(' (')[0] for word in revealed.mixed[:3])}"]
        if revealed.mixed else []) + ([f"{revealed.padded} spaces in a row"] if revealed.padded else [])
    return f"[⚠ {'; '.join(said)}] {revealed.text}"
