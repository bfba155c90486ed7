"""Finding the deployment's secrets in text a job wrote, however they were written, and scrubbing them out: the one
scrubber for what a run's log keeps (run_logs.py) and what the worker posts on the forge (forges/publishing/).

A value is found
- as it is, with any of its characters URL-encoded (`%2F`, either case; `+` for a space) or JSON-escaped (`\\"`,
  `\\u00e9`, `\\/`), and reversed or in rot13,
- in base64, standard or URL-safe, at each of the three alignments it can have inside a longer encoded text (the
  characters that depend on the value's bytes alone), and in base32 at each of its five (either case),
- in hex, either case,
and in each of those forms also split by whitespace, or by `\\n`, `\\r`, `\\t` escapes, between any two characters (a
wrapped line, a JSON string). The encoded and split forms are looked for only in values of ENCODED_MIN_CHARS or more:
in a shorter one they would match ordinary text.

`finds` also reads the text as a forge shows it (`rendered`): HTML comments and tags gone, character references
(`&#115;`, `&amp;`) and Markdown's backslash escapes read, invisible characters (zero-width space, soft hyphen, bidi
marks, ...) dropped; and, against each value without them, Markdown's emphasis and code marks (`*`, `_`, `~`, a
backtick) dropped too. What only such a reading shows cannot be cut out of the text as written: a caller that
publishes refuses the text (or the work) instead. Not caught, by any scrubber: an encoding it does not know (base64
of gzip, a cipher, a value spelled out in words); the defence there is that no credential reaches a job at all.

    scrubber = Scrubber([provider_key, *secret_values])       # or {"ANTHROPIC_API_KEY": key, ...}
    scrubber.finds(text)   # does the text hold one of them, in any of those forms?
    scrubber.scrub(text)   # each occurrence written as it is replaced by SCRUBBED
    scrubber.which(text)   # the name of one it holds (a mapping's key), or None
"""

from __future__ import annotations

import base64
import codecs
import html
import json
import re
from collections.abc import Mapping

SCRUBBED = "[scrubbed]"
ENCODED_MIN_CHARS = 8
# Between any two characters of a split value: whitespace, or the escapes a JSON string writes for it.
SEPARATOR = r"(?:\s|\\[nrt])*"


def _either_case(hex_digits: str) -> str:
    return "".join(f"[{digit.lower()}{digit.upper()}]" if digit.isalpha() else digit for digit in hex_digits)


def _percent(data: bytes) -> str:
    return "".join("%" + _either_case(f"{byte:02x}") for byte in data)


def _character(char: str) -> str:
    """One character of a value: as it is, URL-encoded, or JSON-escaped."""
    forms = {re.escape(char), _percent(char.encode())}
    for ensure_ascii in (True, False):
        escaped = json.dumps(char, ensure_ascii=ensure_ascii)[1:-1]
        forms.add(re.escape(escaped) if not escaped.startswith("\\u") else "\\\\u" + _either_case(escaped[2:]))
    if char == " ":
        forms.add(r"\+")
    if char == "/":
        forms.add(r"\\/")
    return "(?:" + "|".join(sorted(forms)) + ")"


def _base64_character(char: str) -> str:
    """One character of a base64 text, in either alphabet, as it is, URL-encoded or JSON-escaped."""
    if char == "+":
        return r"(?:\+|-|%2[bB])"
    if char == "/":
        return r"(?:\\?/|_|%2[fF])"
    return char


def _aligned_cores(data: bytes, encode, group: int, bits: int) -> list[str]:
    """At each alignment (0 to group - 1 bytes before the value in its encoding's group of `group` bytes), the
    characters of `bits` bits each that only the value's own bits decide."""
    cores = []
    for offset in range(group):
        encoded = encode(bytes(offset) + data + bytes(group - 1)).decode()
        first, end = -(-8 * offset // bits), 8 * (offset + len(data)) // bits
        cores.append(encoded[first:end])
    return cores


def _plain_forms(value: str) -> list[str]:
    """The value, reversed, and in rot13 (each only when it differs from what came before)."""
    return list(dict.fromkeys([value, value[::-1], codecs.encode(value, "rot13")]))


def _patterns(value: str) -> list[str]:
    if len(value) < ENCODED_MIN_CHARS:
        return ["".join(_character(char) for char in value)]
    data = value.encode()
    patterns = [SEPARATOR.join(_character(char) for char in form) for form in _plain_forms(value)]
    patterns.append(SEPARATOR.join(_either_case(digit) for digit in data.hex()))
    patterns += [SEPARATOR.join(_base64_character(char) for char in core)
                 for core in _aligned_cores(data, base64.b64encode, 3, 6)]
    patterns += [SEPARATOR.join(_either_case(char) for char in core)
                 for core in _aligned_cores(data, base64.b32encode, 5, 5)]
    return patterns


# What a forge's page does not show of a text, or shows as another character.
HTML_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.DOTALL)
HTML_TAG = re.compile(r"</?[A-Za-z][^<>]*>")
MARKDOWN_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
                       "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb\U000e0000-\U000e007f]")
MARKDOWN_MARKS = re.compile(r"[*_~`]")


def rendered(text: str) -> str:
    """The text as a forge's page shows it: comments and tags gone, references and escapes read, nothing invisible."""
    shown = HTML_TAG.sub("", HTML_COMMENT.sub("", text))
    return INVISIBLE.sub("", MARKDOWN_ESCAPE.sub(r"\1", html.unescape(shown)))


class Scrubber:
    def __init__(self, values):
        named = dict(values) if isinstance(values, Mapping) else {f"secret {index}": value
                                                                   for index, value in enumerate(values)}
        self._named = {name: value for name, value in named.items() if value}
        distinct = sorted(set(self._named.values()), key=len, reverse=True)  # the longest first
        self._found = _compiled([pattern for value in distinct for pattern in _patterns(value)])
        # Each long value without Markdown's marks, as it is, reversed or in rot13: against a text without them.
        skeletons = {MARKDOWN_MARKS.sub("", value) for value in distinct if len(value) >= ENCODED_MIN_CHARS}
        self._skeletons = _compiled([SEPARATOR.join(re.escape(char) for char in form) for skeleton in skeletons
                                     if len(skeleton) >= ENCODED_MIN_CHARS for form in _plain_forms(skeleton)])

    def finds(self, text: str) -> bool:
        if self._found is None:
            return False
        if self._found.search(text):
            return True
        shown = rendered(text)
        if shown != text and self._found.search(shown):
            return True
        return self._skeletons is not None and self._skeletons.search(MARKDOWN_MARKS.sub("", shown)) is not None

    def scrub(self, text: str) -> str:
        return self._found.sub(SCRUBBED, text) if self._found is not None else text

    def which(self, text: str) -> str | None:
        """The name of a value the text holds (in any form `finds` knows), or None."""
        if not self.finds(text):
            return None
        return next((name for name, value in self._named.items() if Scrubber([value]).finds(text)), None)


def _compiled(patterns: list[str]) -> re.Pattern | None:
    return re.compile("|".join(f"(?:{pattern})" for pattern in patterns)) if patterns else None
