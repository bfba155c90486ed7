"""JSON for files an operator reviews before applying (triggers, limits, pause windows)."""

import json


class DuplicateKeyError(ValueError):
    """An object repeats a key: JSON keeps the last value, so the reviewed file and the applied one differ."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _refuse_duplicate_keys(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKeyError(key)
        seen[key] = value
    return seen


def loads(text: str | bytes):
    """json.loads, refusing an object that repeats a key (DuplicateKeyError, a ValueError)."""
    return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)
