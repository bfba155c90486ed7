"""What a Python file reads from the environment, found in its source (`ast`), not by running it: each variable's name
and, where the default is a literal (or arithmetic on literals), that default. For pidispatch_site/settings.py's
`env(...)`, `env.int(...)`, ... calls and any file's `os.environ.get(...)` / `os.environ[...]`."""

from __future__ import annotations

import ast
import operator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = ROOT / "pidispatch_site" / "settings.py"
COMPUTED = object()  # a default worked out at start (a path under PI_VAR_DIR, a generated key)
_OPERATORS = {ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}


def _literal(node: ast.AST):
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _literal(node.left), _literal(node.right)
        if left is COMPUTED or right is COMPUTED:
            return COMPUTED
        return _OPERATORS[type(node.op)](left, right)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return COMPUTED


def _is_env_reader(function: ast.AST) -> bool:
    """`env(...)` or `env.int(...)` (django-environ), `os.environ.get(...)`."""
    if isinstance(function, ast.Name):
        return function.id == "env"
    if isinstance(function, ast.Attribute):
        owner = function.value
        return (isinstance(owner, ast.Name) and owner.id == "env") or (
            function.attr == "get" and isinstance(owner, ast.Attribute) and owner.attr == "environ")
    return False


def environment_reads(path: Path = SETTINGS) -> dict[str, object]:
    """Every variable the file reads, with its default (None when it gives none, COMPUTED when not a literal)."""
    found: dict[str, object] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and _is_env_reader(node.func) and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            keyword = {item.arg: item.value for item in node.keywords}
            default = keyword.get("default", node.args[1] if len(node.args) > 1 else None)
            found.setdefault(node.args[0].value, None if default is None else _literal(default))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "environ" and isinstance(node.slice, ast.Constant):
            found.setdefault(node.slice.value, None)
    return found


def literal_defaults(path: Path = SETTINGS) -> dict[str, object]:
    return {name: default for name, default in environment_reads(path).items()
            if default is not None and default is not COMPUTED}
