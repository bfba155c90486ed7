"""What of a run's transcript is kept: only the turns pi itself could have written.

The container writes /session/session.jsonl, and the agent in it can write that file too (its tools run there): a
turn it forges would be replayed to the target's next job as pi's own. pi 0.73's session is one JSON entry a line,
a tree by `id` and `parentId`. Kept:

- every line of the session this job was given, byte for byte (it was vetted when it was kept);
- the header (`session`, the first line), `model_change` and `thinking_level_change` entries;
- a `user` message only when it is exactly this job's prompt as pi sends it (the runner passes /job/prompt.md, which
  the worker wrote and the container cannot change): anything else in the user's voice was not the operator's;
- `assistant` messages (the model's words, which the next job's model reads as its own, never as the user's) and a
  `toolResult` that answers one of their tool calls.

Everything else (another role, a compaction or custom entry, which pi would put before the model in the user's
role, a line that is not a JSON entry) is dropped, and the entries that hung from a dropped one are hung from its
nearest kept ancestor, so the tree pi reads stays whole.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

STRUCTURE = frozenset({"model_change", "thinking_level_change"})
PROMPT_FILE = "/job/prompt.md"


def prompt_turn(prompt: str) -> str:
    """The text of the user message pi writes for the runner's `@/job/prompt.md` argument."""
    return f'<file name="{PROMPT_FILE}">\n{prompt}\n</file>\n'


@dataclass(frozen=True)
class Vetted:
    data: bytes
    dropped: int  # entries (or lines) left out


def vet(data: bytes, *, given: bytes, prompt: str) -> Vetted:
    """The transcript `data` without what pi could not have written in this job. `given` is the session the job
    was given; `prompt` the job's prompt.md."""
    trusted = set(given.splitlines())
    expected_user = [{"type": "text", "text": prompt_turn(prompt)}] if prompt else None
    kept: list[tuple[bytes, dict | None]] = []
    dropped_parents: dict[str, str | None] = {}
    tool_calls: set[str] = set()
    dropped = 0
    for index, line in enumerate(data.splitlines()):
        if not line.strip():
            continue
        entry = _entry(line)
        if entry is None:
            dropped += 1
            continue
        if line in trusted or _pi_could_write(entry, index, expected_user, tool_calls):
            kept.append((line, entry))
            message = entry.get("message") if entry.get("type") == "message" else None
            if isinstance(message, dict) and message.get("role") == "assistant":
                tool_calls.update(_tool_call_ids(message))
        else:
            dropped += 1
            if isinstance(entry.get("id"), str):
                dropped_parents[entry["id"]] = entry.get("parentId") if isinstance(entry.get("parentId"), str) else None
    lines = [_rehung(line, entry, dropped_parents) for line, entry in kept]
    return Vetted(data=b"".join(line + b"\n" for line in lines), dropped=dropped)


def _entry(line: bytes) -> dict | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str) or not isinstance(entry.get("id"), str):
        return None
    return entry


def _pi_could_write(entry: dict, index: int, expected_user, tool_calls: set[str]) -> bool:
    kind = entry["type"]
    if kind == "session":
        return index == 0
    if kind in STRUCTURE:
        return True
    if kind != "message" or not isinstance(entry.get("message"), dict):
        return False
    message = entry["message"]
    role = message.get("role")
    if role == "user":
        return expected_user is not None and message.get("content") == expected_user
    if role == "assistant":
        return True
    if role == "toolResult":
        return message.get("toolCallId") in tool_calls
    return False


def _tool_call_ids(message: dict) -> set[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {block["id"] for block in content
            if isinstance(block, dict) and block.get("type") == "toolCall" and isinstance(block.get("id"), str)}


def _rehung(line: bytes, entry: dict, dropped_parents: dict[str, str | None]) -> bytes:
    """The line, its parent moved up past dropped entries (a loop of them ends at the root)."""
    parent = entry.get("parentId")
    if parent not in dropped_parents:
        return line
    seen = set()
    while parent in dropped_parents and parent not in seen:
        seen.add(parent)
        parent = dropped_parents[parent]
    if parent in dropped_parents:
        parent = None
    return json.dumps({**entry, "parentId": parent}, ensure_ascii=False, separators=(",", ":")).encode()
