"""The package's shape: arrows point one way and there are no import cycles (docs/architecture.md §2).

Walks every module's imports with ``ast`` (function-level ones included: a local
import hides a cycle, it does not remove it) and checks them against the layers

    cli → pipeline → stages → components → infrastructure → math

A module may import its own layer or below. The math imports nothing of
toprcli but other math (no config, no CLI, no file I/O, no UserError).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "toprcli"

# Most specific prefix wins. Lower number = closer to the floor.
LAYERS = {
    "toprcli.errors": 0,
    "toprcli.progress": 1,
    "toprcli.interrupt": 1,  # the stop flag the trainer polls; imports nothing of toprcli
    "toprcli.sampling": 1,
    "toprcli.losses": 1,
    "toprcli.curation": 1,
    "toprcli.evaluation": 1,
    "toprcli.training.logprobs": 1,
    "toprcli.training.optim": 1,  # optimizers and schedules: pure torch
    "toprcli.config": 2,
    "toprcli.shards": 2,
    "toprcli.processes": 2,  # the watchdog: no orphans
    "toprcli.generation": 3,
    "toprcli.verifiers": 3,
    "toprcli.training": 3,
    "toprcli.data": 3,
    "toprcli.models": 3,
    "toprcli.roll": 3,
    "toprcli.tracking": 3,  # experiment trackers, one module per backend
    "toprcli.stages": 4,
    "toprcli.launch": 5,
    "toprcli.pipeline": 5,
    "toprcli.runs": 5,  # runs that grow: extension, changes from the next round, branches
    "toprcli.run_paths": 5,  # the files a run's relative paths named when it started
    "toprcli.report": 5,
    "toprcli.compare": 5,  # several runs: seeds as one variant, paired differences
    "toprcli.run_tracking": 5,  # what iterate reports to the trackers, read from the round's files
    "toprcli.cli": 6,
    "toprcli.__main__": 6,
    "toprcli": 0,
}
MATH = 1
NAMES = {0: "errors", 1: "math", 2: "infrastructure", 3: "components", 4: "stages", 5: "pipeline", 6: "cli"}


def layer(module: str) -> int:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best]


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = f.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def imports(path: Path, name: str) -> set[str]:
    """toprcli modules ``path`` imports (the target module, not the imported attribute)."""
    tree = ast.parse(path.read_text())
    known = modules()
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef) and child.name == "__getattr__" and node is tree:
                continue  # PEP 562 lazy attributes: loaded on use, not at import
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("toprcli"))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against this package
                    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
                    pkg = ".".join(pkg.split(".")[: len(pkg.split(".")) - child.level + 1])
                    base = f"{pkg}.{base}" if base else pkg
                if base.startswith("toprcli"):
                    for a in child.names:  # `from toprcli.x import y`: y may be a submodule
                        found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    return {name: imports(path, name) for name, path in modules().items()}


def test_arrows_point_one_way():
    wrong = []
    for mod, deps in graph().items():
        for dep in deps:
            if layer(dep) > layer(mod):
                wrong.append(f"{mod} ({NAMES[layer(mod)]}) imports {dep} ({NAMES[layer(dep)]})")
            elif layer(mod) == MATH and layer(dep) != MATH:
                wrong.append(f"{mod} (math) imports {dep}: the math imports only math")
    assert not wrong, "\n".join(sorted(wrong))


def test_nothing_outside_cli_imports_the_cli():
    users = [m for m, deps in graph().items() if layer(m) < layer("toprcli.cli") and any(d.startswith("toprcli.cli") for d in deps)]
    assert not users


def test_no_import_cycles():
    g = graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def walk(node: str, path: list[str]) -> None:
        seen[node] = 1
        for dep in sorted(g.get(node, ())):
            if seen.get(dep) == 1:
                cycles.append(" → ".join(path[path.index(dep):] + [dep]))
            elif dep not in seen:
                walk(dep, path + [dep])
        seen[node] = 2

    for m in sorted(g):
        if m not in seen:
            walk(m, [m])
    assert not cycles, "\n".join(cycles)


def test_no_module_is_over_450_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert not {n: c for n, c in long.items() if c > 450}


# -- the repo stands alone ------------------------------------------------------------

REPO = PACKAGE.parent
# Ways a file reaches a folder beside the checkout (pieces joined, so this file does not match itself).
OUTSIDE = [re.compile(p) for p in (r"\.\./" + "shared", r"\.parent\s*/\s*[\"']" + "shared", r"\b(REPO|ROOT)\.parent\b")]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".cfg", ".txt", ".json", ""}


def tracked_files() -> list[Path]:
    try:
        names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist): every file
        return [p for p in REPO.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]
    return [REPO / n for n in names]


def test_no_file_reaches_outside_the_repo():
    """Nothing tracked refers to the workshop folder beside the checkout (no user has it) or climbs above the repo root
    with ``Path(__file__).parents[k]``."""
    wrong = []
    for path in tracked_files():
        if path.suffix not in TEXT_SUFFIXES or not path.is_file() or path.stat().st_size > 1_000_000 or path == Path(__file__).resolve():
            continue  # (this file names the patterns it looks for)
        text = path.read_text(errors="replace")
        rel = path.relative_to(REPO)
        wrong += [f"{rel}: {m.group(0)!r}" for pattern in OUTSIDE for m in pattern.finditer(text)]
        if path.suffix == ".py":
            depth = len(rel.parts) - 1  # parents[depth] is the repo root
            wrong += [f"{rel}: parents[{k}] is above the repo" for k in map(int, re.findall(r"__file__\)\.resolve\(\)\.parents\[(\d+)\]", text)) if k > depth]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_reference_outside():
    assert any(p.search("GSM8K = REPO.parent / 'x'") for p in OUTSIDE)
    assert any(p.search("data at ../" + "shared/datasets") for p in OUTSIDE)


def test_architecture_citations_name_sections_that_exist():
    doc = (REPO / "docs" / "architecture.md").read_text()
    sections = set(re.findall(r"^## §(\d+)", doc, re.M))
    cited = []
    for path in [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "docs").glob("*.md")]:
        cited += [(path.name, n) for n in re.findall(r"architecture\.md §(\d+)", path.read_text())]
    assert cited and all(n in sections for _, n in cited), [c for c in cited if c[1] not in sections]


def test_functions_are_short():
    """Every function reads at once (no function over 80 lines, docstring included): the CLI is generated from
    the configs (no option table written out by hand), and a long stage or loop is split into named steps."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long
