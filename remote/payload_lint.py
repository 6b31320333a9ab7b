"""lint-payload: find the code that breaks inside the exec envelope before the gateway does.

The gateway runs a payload with ``exec(code, globals, locals)`` and two SEPARATE dicts (docs/envelope-protocol.md).
Top-level names then land in ``locals``, and every nested scope (a function, lambda, class body,
comprehension or generator expression) looks names up in ``globals`` only, so it cannot see them:

    import os
    def pid():
        return os.getpid()        # NameError: name 'os' is not defined

    k = 3
    print([n * k for n in range(3)])   # NameError: name 'k' is not defined

Payloads must therefore be flat: for loops, if, append. Rules (their ids are a contract):

- ``no-def``            a ``def`` or ``async def``, anywhere
- ``no-lambda``         a ``lambda``, anywhere
- ``no-class``          a ``class``, anywhere
- ``no-comprehension``  a list, set or dict comprehension, anywhere
- ``no-genexp``         a generator expression, anywhere
- ``import-where-used`` a name that is used but never imported nor assigned anywhere in the payload and is not
                        a builtin: a NameError waiting to happen. One violation per name, at its first use.
                        Skipped when the payload has a ``from ... import *`` (its names can't be known).

Lines are 1-based, columns 1-based (as editors count).

Usage: ``python -m samai.remote.payload_lint FILE...`` (``-`` reads stdin). Prints ``FILE:LINE:COL: RULE message``
per violation. Exit 0: clean; 1: violations; 2: a file could not be read or is not valid Python (printed as
``FILE:LINE:COL: syntax-error message``; code nested deeper than the parser's limits counts as invalid).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import sys
from dataclasses import dataclass
from typing import NamedTuple


class Violation(NamedTuple):
    line: int
    col: int
    rule: str
    message: str


# What exec's globals give every payload besides the builtins.
PREDEFINED = {"__name__", "__builtins__"}
BUILTIN_NAMES = set(dir(builtins))

FLAT_HINT = "write it flat (for loops, if, append)"


def _scope_rule(node: ast.AST) -> tuple[str, str] | None:
    """The rule and message for a node that opens a nested scope, or None."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return "no-def", f"def {node.name}: its body cannot see the payload's top-level imports and names; {FLAT_HINT}"
    if isinstance(node, ast.Lambda):
        return "no-lambda", f"lambda: its body cannot see the payload's top-level names; {FLAT_HINT}"
    if isinstance(node, ast.ClassDef):
        return "no-class", f"class {node.name}: its body and methods cannot see the payload's top-level names; " \
                           "use dicts and flat code"
    if isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp):
        kind = {ast.ListComp: "list", ast.SetComp: "set", ast.DictComp: "dict"}[type(node)]
        return "no-comprehension", f"{kind} comprehension: a nested scope that cannot see top-level names; " \
                                   "use a for loop and append"
    if isinstance(node, ast.GeneratorExp):
        return "no-genexp", "generator expression: a nested scope that cannot see top-level names " \
                            "(e.g. sorted(x for x in xs if x > limit)); build a list with a for loop"
    return None


def scope_violations(tree: ast.AST) -> list[Violation]:
    found = []
    for node in ast.walk(tree):
        # Every scope-opening node is a statement or an expression: the nodes that carry a position.
        if not isinstance(node, ast.stmt | ast.expr):
            continue
        rule = _scope_rule(node)
        if rule:
            found.append(Violation(node.lineno, node.col_offset + 1, *rule))
    return found


@dataclass
class Bindings:
    names: set[str]
    star_import: bool


def _names_bound_by(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
        return [node.id]
    if isinstance(node, ast.Import):
        return [alias.asname or alias.name.split(".")[0] for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [alias.asname or alias.name for alias in node.names]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
        return [node.name]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [node.rest]
    return []


def bindings(tree: ast.AST) -> Bindings:
    """Every name the payload imports or assigns, anywhere (the rule is deliberately scope-blind)."""
    names: set[str] = set()
    star = False
    for node in ast.walk(tree):
        bound = _names_bound_by(node)
        star = star or "*" in bound
        names.update(bound)
    return Bindings(names, star)


def unbound_name_violations(tree: ast.AST) -> list[Violation]:
    known = bindings(tree)
    if known.star_import:
        return []
    uses = sorted((node.lineno, node.col_offset, node.id) for node in ast.walk(tree)
                  if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load))
    found, reported = [], set()
    for line, col, name in uses:
        if name in known.names or name in BUILTIN_NAMES or name in PREDEFINED or name in reported:
            continue
        reported.add(name)
        found.append(Violation(line, col + 1, "import-where-used",
                               f"name {name!r} is used but never imported or assigned in the payload"))
    return found


def lint(source: str) -> list[Violation]:
    """The payload's violations, in source order. Raises SyntaxError if it is not valid Python."""
    tree = ast.parse(source, "<payload>")
    return sorted(scope_violations(tree) + unbound_name_violations(tree))


# ---------------------------------------------------------------------------------------------------------------
# Command line


def read_source(path: str) -> str:
    """The file's text, honouring a PEP 263 coding line as the gateway's compile() would."""
    if path == "-":
        return importlib.util.decode_source(sys.stdin.buffer.read())
    with open(path, "rb") as f:
        return importlib.util.decode_source(f.read())


def lint_file(path: str) -> int:
    """Print the file's violations; its exit code (0, 1 or 2)."""
    try:
        violations = lint(read_source(path))
    except (OSError, UnicodeDecodeError) as e:  # before ValueError: UnicodeDecodeError is one
        print(f"lint-payload: cannot read {path}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 2
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes in the source
        line, col = (getattr(e, "lineno", None) or 1), (getattr(e, "offset", None) or 1)
        print(f"{path}:{line}:{col}: syntax-error {getattr(e, 'msg', None) or e}")
        return 2
    except (RecursionError, MemoryError):  # the parser's own limits: the gateway's compile() fails the same way
        print(f"{path}:1:1: syntax-error too deeply nested for Python's parser")
        return 2
    for v in violations:
        print(f"{path}:{v.line}:{v.col}: {v.rule} {v.message}")
    return 1 if violations else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lint-payload",
                                     description="Check payloads meant for the exec envelope (flat code only).")
    parser.add_argument("files", nargs="+", metavar="FILE", help="payload file(s); - reads stdin")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return max(lint_file(path) for path in args.files)


if __name__ == "__main__":
    sys.exit(main())
