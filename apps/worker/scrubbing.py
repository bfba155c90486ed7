"""Finding the deployment's secrets in text a job wrote, however they were written, and scrubbing them out: the one
scrubber for what a run's log keeps (run_logs.py) and what the worker posts on the forge (forges/publishing/).

A value is found
- as it is, with any of its characters URL-encoded (`%2F`, either case; `+` for a space) or JSON-escaped (`\\"`,
  `\\u00e9`, `\\/`),
- in base64, standard or URL-safe, at each of the three alignments it can have inside a longer encoded text (the
  characters that depend on the value's bytes alone),
- in hex, either case,
and in each of those forms also split by whitespace, or by `\\n`, `\\r`, `\\t` escapes, between any two characters (a
wrapped line, a JSON string). The encoded and split forms are looked for only in values of ENCODED_MIN_CHARS or more:
in a shorter one they would match ordinary text.

    scrubber = Scrubber([provider_key, *secret_values])
    scrubber.finds(text)   # does the text hold one of them, in any of those forms?
    scrubber.scrub(text)   # each occurrence replaced by SCRUBBED
"""

from __future__ import annotations

import base64
import json
import re

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


def _base64_cores(data: bytes) -> list[str]:
    """At each alignment (0, 1 or 2 bytes before the value in its group of three), the base64 characters that only
    the value's own bits decide."""
    cores = []
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + data + bytes(2)).decode()
        first, end = -(-8 * offset // 6), 8 * (offset + len(data)) // 6
        cores.append(encoded[first:end])
    return cores


def _patterns(value: str) -> list[str]:
    if len(value) < ENCODED_MIN_CHARS:
        return ["".join(_character(char) for char in value)]
    data = value.encode()
    patterns = [SEPARATOR.join(_character(char) for char in value),
                SEPARATOR.join(_either_case(digit) for digit in data.hex())]
    patterns += [SEPARATOR.join(_base64_character(char) for char in core) for core in _base64_cores(data)]
    return patterns


class Scrubber:
    def __init__(self, values):
        distinct = sorted({value for value in values if value}, key=len, reverse=True)  # the longest first
        patterns = [pattern for value in distinct for pattern in _patterns(value)]
        self._found = re.compile("|".join(f"(?:{pattern})" for pattern in patterns)) if patterns else None

    def finds(self, text: str) -> bool:
        return self._found is not None and self._found.search(text) is not None

    def scrub(self, text: str) -> str:
        return self._found.sub(SCRUBBED, text) if self._found is not None else text
