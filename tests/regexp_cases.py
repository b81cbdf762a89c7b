"""Kernel-mapping regexps with Go's verdict on each, shared by the unit test
(against Go's regexp itself) and the integration test (against the API
server's admission). Not a test module."""

from __future__ import annotations

from typing import Final

#: Kernel strings (and a few others) every accepted pattern is matched against.
SUBJECTS: Final = (
    "5.14.0-427.13.1.el9_4.x86_64",
    "6.8.0-45-generic",
    "6.1.0-27-amd64",
    "5.14.0-427.el9.x86_64",
    "λ6.8-αβ",
    "١٢٣-generic",
    "",
)

#: (id, pattern): Go's regexp accepts these.
ACCEPTED: Final = (
    ("plain", r"^5\.14\.0-\d+\.el9_\d+\.x86_64$"),
    ("unanchored", r"generic"),
    ("anchors", r"^6\.8\.0-45-generic$"),
    ("text-anchors", r"\A6\.8.*generic\z"),
    ("word-boundary", r"\bgeneric\b"),
    ("multiline", r"(?m)^6\.1\."),
    ("ignore-case", r"(?i)^5\.14\.0-.*EL9"),
    ("ignore-case-group", r"(?i:X86_64)$"),
    ("dot-newline", r"(?s)^6.8"),
    ("ungreedy", r"(?U)\d+-generic"),
    ("unicode-greek", r"\p{Greek}"),
    ("unicode-greek-anchored", r"^\p{Greek}+$"),
    ("unicode-number", r"^\p{N}+-generic$"),
    ("unicode-number-letter", r"\pN"),
    ("unicode-negated", r"^\P{Greek}+$"),
    ("unicode-caret-negated", r"^\p{^Greek}+$"),
    ("unicode-in-class", r"[\p{Greek}\d]+"),
    ("unicode-lower-case-name", r"\p{greek}"),
    ("unicode-alias", r"^\p{Letter}"),
    ("unicode-ascii", r"^\p{ASCII}+$"),
    ("unicode-not-ascii-in-class", r"[^\p{ASCII}]"),
    ("unicode-any", r"\p{Any}"),
    ("named-groups", r"^(?P<major>\d+)\.(?<minor>\d+)"),
    ("quoted", r"\Q5.14\E"),
    ("posix-class", r"^[[:digit:]]+\."),
    ("repeat-1000", r"x{1000}"),
    ("nested-plus", r"(([\w.]+)+)+!"),
    ("alternation-plus", r"^(\d+|\d+\.?)+-generic$"),
)

#: (id, pattern): Python's ``re`` accepts these; Go's regexp (RE2) does not.
REFUSED_PYTHON_ACCEPTS: Final = (
    ("backreference", r"^(\d)\.\1"),
    ("named-backreference", r"(?P<x>\d)(?P=x)"),
    ("lookahead", r"^(?=5)"),
    ("negative-lookahead", r"^(?!5).*$"),
    ("lookbehind", r"(?<=el9)_4"),
    ("negative-lookbehind", r"(?<!el9)_4"),
    ("possessive-plus", r"\d++"),
    ("possessive-star", r"a*+"),
    ("atomic-group", r"(?>a)"),
    ("conditional", r"(a)?(?(1)b|c)"),
    ("python-end-anchor", r"generic\Z"),
    ("verbose-flag", r"(?x) a b"),
    ("ascii-flag", r"(?a:\w)"),
    ("comment-group", r"(?#note)6"),
    ("unicode-group-name", r"(?P<é>6)"),
)

#: (id, pattern): neither accepts; or only C++ RE2 does (Go refuses).
REFUSED: Final = (
    ("missing-paren", r"^(6.0"),
    ("unexpected-paren", r"6)"),
    ("missing-bracket", r"[6"),
    ("repeat-too-large", r"x{1001}"),
    ("missing-repeat-argument", r"*6"),
    ("nested-repeat", r"a**"),
    ("unknown-class", r"\p{Foo}"),
    ("bad-range", r"[z-a]"),
    ("trailing-backslash", "6\\"),
    ("bad-escape", r"\8"),
    ("bad-hex", r"\x{110000}"),
    ("unterminated-hex", r"\x{"),
    ("unterminated-flags", r"(?i"),
    ("any-byte", r"\C"),  # C++ RE2 has it, Go does not
    ("underscore-script", r"\p{Old_Italic}"),  # Go's lookup never finds it
)

#: (id, pattern): Go accepts these; kmm refuses them (``regexps.MEMORY_BUDGET``).
TOO_LARGE_FOR_KMM: Final = (("unicode-repeated", r"\pL{100}"),)
