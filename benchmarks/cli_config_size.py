"""What the lines of `toprcli/cli/` and `toprcli/config/` are, by kind: #24's size criterion, measured.

Each line is counted once, in the first kind that claims it: field declarations of the config dataclasses,
help text (docstrings and the commands' DOC strings with their examples), each command's summary table,
imports, blank lines, comments, and the rest (the builder, the loader, the error boundary, the bars, the
cross-field rules, the hand-written commands).

Usage: python benchmarks/cli_config_size.py
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "toprcli"
HELP, TABLES, FIELDS = "help text: docstrings and command DOCs with examples", "summary tables (each command's own)", \
    "field declarations (type, default, help, flag, check)"
TABLE_FUNCTIONS = ("show", "print_rounds", "model_rows", "commented_yaml")


def kinds(path: Path) -> list[str]:
    """The kind of each line of ``path``."""
    lines = path.read_text().splitlines()
    tag: list[str | None] = [None] * (len(lines) + 1)

    def mark(node: ast.AST, kind: str) -> None:
        for i in range(node.lineno, node.end_lineno + 1):
            tag[i] = tag[i] or kind

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node) is not None:
            mark(node.body[0], HELP)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "DOC" for t in node.targets):
            mark(node, HELP)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mark(node, "imports")
        if isinstance(node, ast.FunctionDef) and (node.name in TABLE_FUNCTIONS or path.name in ("report.py", "info.py")):
            mark(node, TABLES)
        if isinstance(node, ast.ClassDef) and path.name == "schema.py":
            for statement in (s for s in node.body if isinstance(s, ast.AnnAssign)):
                mark(statement, FIELDS)
    return ["blank lines" if not line.strip() else tag[i] or ("comments" if line.strip().startswith("#") else "the rest")
            for i, line in enumerate(lines, 1)]


def main() -> None:
    counts: dict[str, int] = {}
    for path in sorted([*(PACKAGE / "cli").glob("*.py"), *(PACKAGE / "config").glob("*.py")]):
        for kind in kinds(path):
            counts[kind] = counts.get(kind, 0) + 1
    for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"{n:6,}  {kind}")
    print(f"{sum(counts.values()):6,}  in all (#24's target: 1,311, 70% of the 1,874 it counted)")


if __name__ == "__main__":
    main()
