"""Kernel-mapping regexps: Go's dialect, judged and run by RE2 (DESIGN §3).

KMM matches ``kernelMappings[].regexp`` with Go's ``regexp`` package, and the
API server judges the CRD rule with the same package (CEL's ``matches``).
kmm runs RE2 itself (``google-re2``, the C++ library Go's package was ported
from): linear in the input, no backtracking, so no pattern can stall the
operator. The two parse almost the same language; this module closes the
gaps so that kmm accepts exactly the patterns Go accepts and refuses the
others in Go's own words, so the operator's message equals the API server's:

- Unicode class names: Go (since 1.25, after Unicode TR18) looks ``\\p{…}``
  up ignoring case, ``_``, ``-`` and spaces, and knows aliases
  (``\\p{Letter}``), ``Any``, ``ASCII``, ``Assigned``, ``LC`` and ``Cn``; RE2
  wants exact names. Each class is resolved against Go's tables
  (:mod:`kmm.api.unicodenames`, generated from Go) and respelled in RE2's
  terms. Go's lookup never finds scripts whose table name is not in its
  canonical form (``Old_Italic``, ``SignWriting``): nor does kmm's.
- ``\\C`` (any byte) is RE2's alone; Go refuses it.
- Group names: Go allows ASCII letters, digits and ``_``; RE2 any word character.
- Error texts: RE2 words its errors differently; they are reworded as Go's
  ``regexp/syntax`` words them (``error parsing regexp: <code>: `<expr>```).

Deliberate limits:

- Nesting: Go refuses nesting deeper than 1000, which the API's 1024
  characters cannot reach; kmm does not check it.
- Memory: RE2 compiles a pattern to a byte-level program, and a large Unicode
  class repeated (``\\pL{300}``) costs it seconds of CPU and tens of MiB where
  Go spends microseconds. A pattern whose program needs more than
  ``MEMORY_BUDGET`` is refused (by the operator; the API server cannot know),
  which bounds what one Module's mapping can cost the operator's event loop.
- Matching: Unicode properties come from RE2's tables, which may be of a
  newer Unicode than Go's; and inside brackets Go's classes that include the
  unassigned code points (``\\p{C}``, ``\\p{Cn}``, ``\\P{LC}``) match them,
  kmm's do not. Kernel versions are ASCII.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Final, Protocol, cast

import re2  # type: ignore[import-untyped]

from kmm.api import unicodenames

__all__ = ["MEMORY_BUDGET", "Regexp", "RegexpError", "compile", "error", "search"]

# Enough for any pattern a kernel version needs (a typical one compiles to a
# few KiB); the worst pattern under it compiles in ~30 ms on one core.
MEMORY_BUDGET: Final = 256 << 10

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False
_OPTIONS.max_mem = MEMORY_BUDGET


class Regexp(Protocol):
    """A compiled pattern: ``search`` is an unanchored match, as Go's ``MatchString``."""

    def search(self, text: str) -> object | None: ...


class RegexpError(ValueError):
    """A pattern Go's regexp refuses (Go's text), or one over kmm's memory budget."""


def compile(pattern: str) -> Regexp:
    """The compiled ``pattern`` (cached); raises ``RegexpError``."""
    judged = _judge(pattern)
    if isinstance(judged, str):
        raise RegexpError(judged)
    return judged


def error(pattern: str) -> str | None:
    """Why ``pattern`` is refused, in Go's words, or None when it is valid."""
    judged = _judge(pattern)
    return judged if isinstance(judged, str) else None


def search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text``; raises ``RegexpError``."""
    return compile(pattern).search(text) is not None


# Each compiled program holds at most MEMORY_BUDGET; this bounds the cache.
@functools.lru_cache(maxsize=128)
def _judge(pattern: str) -> Regexp | str:
    # Go's JSON decoder turns a lone surrogate into U+FFFD; so does this.
    pattern = pattern.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    translated = _Translator(pattern).run()
    compiled = _re2(translated.text)
    if translated.error is None:
        return _go_text(compiled, translated) if isinstance(compiled, tuple) else compiled
    # RE2 may find an error before the Go-only one: Go would find it first.
    if not isinstance(compiled, tuple) or compiled[0] in _ONLY_AT_END:
        return translated.error
    # The prefix may cut that error's quote short ("(?" of "(?("); with the
    # rest of the pattern behind it RE2 quotes it whole.
    whole = _re2(translated.text + pattern[translated.stop :])
    if isinstance(whole, tuple) and whole[0] == compiled[0]:
        return _go_text(whole, translated)
    return _go_text(compiled, translated)


def _re2(text: str) -> Regexp | tuple[str, str | None]:
    """RE2's program for ``text``, or its error as (code, quote)."""
    try:
        return cast(Regexp, re2.compile(text, _OPTIONS))
    except re2.error as err:
        reason = err.args[0]
        return _split(reason.decode() if isinstance(reason, bytes) else str(reason))


# RE2's error codes (re2.cc) and Go's (regexp/syntax) for the same mistakes.
_GO_CODES: Final = {
    "invalid escape sequence": "invalid escape sequence",
    "invalid character class": "invalid character class",
    "invalid character class range": "invalid character class range",
    "missing ]": "missing closing ]",
    "missing )": "missing closing )",
    "unexpected )": "unexpected )",
    "trailing \\": "trailing backslash at end of expression",
    "no argument for repetition operator": "missing argument to repetition operator",
    "invalid repetition size": "invalid repeat count",
    "bad repetition operator": "invalid nested repetition operator",
    "invalid perl operator": "invalid or unsupported Perl syntax",
    "invalid UTF-8": "invalid UTF-8",
    "invalid named capture group": "invalid named capture",
}
_TOO_LARGE: Final = "pattern too large - compile failed"
# Errors RE2 reports at the end of the text: in a prefix they are artefacts.
_ONLY_AT_END: Final = frozenset({"missing ]", "missing )", _TOO_LARGE})
# Errors both quote the whole pattern for.
_WHOLE: Final = frozenset({"missing )", "unexpected )"})


def _split(reason: str) -> tuple[str, str | None]:
    """RE2's ``"<code>: <expr>"`` (or a bare code) as (code, expr)."""
    for code in sorted(_GO_CODES, key=len, reverse=True):
        if reason == code:
            return code, None
        if reason.startswith(code + ": "):
            return code, reason[len(code) + 2 :]
    return reason, None


def _go_error(code: str, expr: str) -> str:
    return f"error parsing regexp: {code}: `{expr}`"


def _go_text(found: tuple[str, str | None], translated: _Translation) -> str:
    code, expr = found
    if code == _TOO_LARGE:
        return (
            f"regexp `{translated.original}` is too large for kmm: RE2 needs more than "
            f"{MEMORY_BUDGET >> 10} KiB to compile it, the most one pattern may cost the "
            "operator (Go's regexp accepts it; repeat large Unicode classes less)"
        )
    go_code = _GO_CODES.get(code)
    if go_code is None:  # a code this table does not know: RE2's text, unchanged
        return f"error parsing regexp: {code}" + (f": {expr}" if expr else "")
    if code in _WHOLE:
        return _go_error(go_code, translated.original)
    quote = translated.original_of(expr or "", at_end=code in _ONLY_AT_END)
    if code == "invalid perl operator" and translated.text != translated.original:
        # Go quotes a bad flag group up to the first rune that is not a flag,
        # which may be one kmm respelled: quote the user's pattern as Go does.
        start = translated.original.find(quote)
        if start >= 0:
            quote = _flags_quote(translated.original, start)
    return _go_error(go_code, quote)


def _flags_quote(pattern: str, start: int) -> str:
    """What Go's ``parsePerlFlags`` quotes for a bad ``(?flags`` at ``start``."""
    index, negated, flagged = start + 2, False, False
    while index < len(pattern):
        char = pattern[index]
        index += 1
        if char in "imsU":
            flagged = True
        elif char == "-" and not negated:
            negated, flagged = True, False
        elif char in ":)" and not (negated and not flagged):
            break  # a valid group: not what failed
        else:
            return pattern[start:index]
    return pattern[start:index]


@dataclasses.dataclass(frozen=True)
class _Translation:
    """The pattern respelled for RE2, up to the first Go-only error if any.

    ``origins[i]`` is the span of ``original`` that ``text[i]`` came from and
    whether it was copied unchanged, so an RE2 error quoting the respelled
    text can quote the user's instead.
    """

    original: str
    text: str
    origins: tuple[tuple[int, int, bool], ...]
    error: str | None
    stop: int  # how much of ``original`` ``text`` covers

    def original_of(self, expr: str, *, at_end: bool) -> str:
        if not expr or self.text == self.original:
            return expr
        if at_end:
            start = self.text.rfind(expr)
        else:  # the first occurrence that the user wrote, not one kmm respelled
            start = self.text.find(expr)
            while start >= 0 and not self.origins[start][2]:
                start = self.text.find(expr, start + 1)
        if start < 0:
            return expr
        first, last = self.origins[start], self.origins[start + len(expr) - 1]
        return self.original[first[0] : last[1]]


class _GoOnly(Exception):
    """Go refuses the construct reached (its text in ``message``); RE2 would not."""

    def __init__(self, message: str) -> None:
        self.message = message


# Members, inside brackets, of the classes RE2 has no table for.
_ASSIGNED: Final = r"\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}\p{C}"
_NOT_C: Final = r"\p{L}\p{M}\p{N}\p{P}\p{S}\p{Z}"  # Go's C includes the unassigned
_LC: Final = r"\p{Lu}\p{Ll}\p{Lt}"
_NOT_LC: Final = r"\p{Lm}\p{Lo}\p{M}\p{N}\p{P}\p{S}\p{Z}\p{C}"

# Go key -> (members when positive, members when negated); a leading "^"
# means "the complement of" (writable only as a bracket of its own; inside
# brackets the approximation after "|" is used).
_SPECIAL: Final = {
    "C": ("^" + _NOT_C + "|" + r"\p{C}", _NOT_C),
    "Cn": ("^" + _ASSIGNED + "|" + r"\P{Any}", _ASSIGNED),
    "LC": (_LC, "^" + _LC + "|" + _NOT_LC),
    "ASCII": (r"\x00-\x7F", r"\x{80}-\x{10FFFF}"),
}

_CATEGORIES: Final = frozenset(unicodenames.CATEGORIES)
_SCRIPTS: Final = frozenset(unicodenames.SCRIPTS)


def _canonical(name: str) -> str:
    """Go's ``canonicalName``: first letter upper, the rest lower, no ``_ -`` or spaces."""
    out = []
    first = True
    for char in name:
        if char in "_- ":
            continue
        if first:
            out.append(char.upper() if "a" <= char <= "z" else char)
            first = False
        else:
            out.append(char.lower() if "A" <= char <= "Z" else char)
    return "".join(out)


@functools.cache
def _aliases() -> dict[str, str]:
    return {_canonical(alias): key for alias, key in unicodenames.CATEGORY_ALIASES.items()}


def _lookup(name: str) -> tuple[str, int] | None:
    """Go's ``unicodeTable``: the table key for ``name`` and its sign, or None."""
    name = _canonical(name)
    special = {"Any": ("Any", 1), "Assigned": ("Cn", -1), "Ascii": ("ASCII", 1), "Lc": ("LC", 1)}
    if name in special:
        return special[name]
    if name in _CATEGORIES or name in _SCRIPTS:
        return name, 1
    key = _aliases().get(name)
    return (key, 1) if key is not None else None


def _spelling(key: str, sign: int, *, in_class: bool) -> str:
    """RE2's spelling of Go's class ``key`` (negated when ``sign`` < 0)."""
    if key not in _SPECIAL:
        return ("\\p{" if sign > 0 else "\\P{") + key + "}"
    members = _SPECIAL[key][0 if sign > 0 else 1]
    if members.startswith("^"):
        complement, approximation = members[1:].split("|")
        return approximation if in_class else f"[^{complement}]"
    return members if in_class else f"[{members}]"


_PERL_CLASSES: Final = frozenset("dDsSwW")


class _Translator:
    """One left-to-right pass over a pattern, tokenising it as Go's parser does."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.at = 0
        self.out: list[str] = []
        self.origins: list[tuple[int, int, bool]] = []

    def run(self) -> _Translation:
        found: str | None = None
        try:
            while self.at < len(self.pattern):
                self._atom()
        except _GoOnly as refusal:
            found = refusal.message
        return _Translation(self.pattern, "".join(self.out), tuple(self.origins), found, self.at)

    def _copy(self, end: int) -> None:
        for index in range(self.at, end):
            self.out.append(self.pattern[index])
            self.origins.append((index, index + 1, True))
        self.at = end

    def _respell(self, end: int, text: str) -> None:
        # Characters the respelling shares with the original at its start map
        # one to one (an error quoting "\" of "\pN" quotes just that).
        same = 0
        while same < min(len(text), end - self.at) and text[same] == self.pattern[self.at + same]:
            same += 1
        self.out.append(text)
        self.origins.extend((self.at + i, self.at + i + 1, False) for i in range(same))
        self.origins.extend([(self.at + same, end, False)] * (len(text) - same))
        self.at = end

    def _atom(self) -> None:
        char = self.pattern[self.at]
        if char == "[":
            self._class()
        elif char == "(" and self.pattern.startswith("(?", self.at):
            self._group()
        elif char == "\\":
            self._escape()
        else:
            self._copy(self.at + 1)

    def _group(self) -> None:
        # Go's parsePerlFlags: "(?P<" and "(?<" always start a named group.
        rest = self.pattern[self.at :]
        with_p = len(rest) > 4 and rest[2] == "P" and rest[3] == "<"
        if not with_p and not (len(rest) > 3 and rest[2] == "<"):
            self._copy(self.at + 2)
            return
        end = rest.find(">")
        if end < 0:
            raise _GoOnly(_go_error("invalid named capture", rest))
        name = rest[4 if with_p else 3 : end]
        if not name or not all(c == "_" or (c.isascii() and c.isalnum()) for c in name):
            raise _GoOnly(_go_error("invalid named capture", rest[: end + 1]))
        self._copy(self.at + end + 1)

    def _escape(self) -> None:
        nxt = self.pattern[self.at + 1 : self.at + 2]
        if nxt == "Q":
            close = self.pattern.find("\\E", self.at + 2)
            self._copy(len(self.pattern) if close < 0 else close + 2)
        elif nxt in ("p", "P"):
            self._unicode_class(in_class=False)
        else:
            self._copy(self._escape_end())

    def _escape_end(self) -> int:
        """Where the escape at ``at`` ends; Go-only refusals raise."""
        start, pattern = self.at, self.pattern
        nxt = pattern[start + 1 : start + 2]
        if nxt == "C":
            raise _GoOnly(_go_error("invalid escape sequence", "\\C"))
        if nxt != "x":
            return min(start + 2, len(pattern))
        # Go's parseEscape for \x: "\xHH" or "\x{H...}" up to U+10FFFF.
        index = start + 2
        if pattern[index : index + 1] != "{":
            return min(index + 2, len(pattern))
        index += 1
        value = 0
        while index < len(pattern) and pattern[index] != "}":
            digit = int(pattern[index], 16) if pattern[index] in _HEX else -1
            value = value * 16 + digit
            if digit < 0 or value > 0x10FFFF:
                return index + 1  # RE2 refuses it in Go's words
            index += 1
        if index >= len(pattern):
            raise _GoOnly(_go_error("invalid escape sequence", pattern[start:]))
        return index + 1

    def _unicode_class(self, *, in_class: bool) -> None:
        # Go's parseUnicodeClass: "\pX" or "\p{name}", "^" negating.
        start, pattern = self.at, self.pattern
        sign = -1 if pattern[start + 1] == "P" else 1
        if pattern[start + 2 : start + 3] == "{":
            close = pattern.find("}", start)
            if close < 0:
                raise _GoOnly(_go_error("invalid character class range", pattern[start:]))
            end, name = close + 1, pattern[start + 3 : close]
        else:
            end = min(start + 3, len(pattern))
            name = pattern[start + 2 : end]
        if name.startswith("^"):
            sign, name = -sign, name[1:]
        found = _lookup(name)
        if found is None:
            raise _GoOnly(_go_error("invalid character class range", pattern[start:end]))
        key, table_sign = found
        self._respell(end, _spelling(key, sign * table_sign, in_class=in_class))

    def _class(self) -> None:
        # Go's parseClass: "]" and "-" are literal first; "[:name:]"; ranges.
        pattern = self.pattern
        self._copy(self.at + 1)
        if pattern.startswith("^", self.at):
            self._copy(self.at + 1)
        first = True
        while self.at < len(pattern) and (pattern[self.at] != "]" or first):
            first = False
            if pattern.startswith("[:", self.at):
                close = pattern.find(":]", self.at + 2)
                if close >= 0:
                    self._copy(close + 2)
                    continue
            if pattern.startswith(("\\p", "\\P"), self.at):
                self._unicode_class(in_class=True)
                continue
            if pattern[self.at] == "\\" and pattern[self.at + 1 : self.at + 2] in _PERL_CLASSES:
                self._copy(self.at + 2)
                continue
            self._class_char()
            rest = pattern[self.at : self.at + 2]
            if len(rest) == 2 and rest[0] == "-" and rest[1] != "]":
                self._copy(self.at + 1)
                self._class_char()
        if self.at < len(pattern):
            self._copy(self.at + 1)

    def _class_char(self) -> None:
        if self.at >= len(self.pattern):
            return
        if self.pattern[self.at] == "\\":
            self._copy(self._escape_end())
        else:
            self._copy(self.at + 1)


_HEX: Final = frozenset("0123456789abcdefABCDEF")
