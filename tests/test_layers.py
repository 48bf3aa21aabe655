"""The layering: ``lint-imports`` (the contract in pyproject.toml, run by ``make lint``) keeps
the package's layers and the runtime's loop modules apart; this test keeps the shipped code
and the benchmarks from importing the test suite (``tests/`` is the leaf of the project)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_nothing_shipped_and_no_benchmark_imports_the_tests() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            m for m in imported_modules(path) if m.split(".")[0] == "tests"
        )
        for folder in ("chongming_redis", "bench")
        for path in (ROOT / folder).rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_layers_contract_holds() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run([str(lint_imports)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
