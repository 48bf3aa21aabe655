"""The layering and the layout: ``lint-imports`` (the contracts in pyproject.toml, also run by
``make lint``) holds; every top-level module and folder is in the package contract, and every
module of a folder in its folder's contract (none left unordered); every package folder is
listed for the wheel; every asyncio twin follows the naming rule; and the shipped code and the
benchmarks never import the test suite (``tests/`` is the leaf of the project)."""

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


def _contracts() -> list[dict[str, object]]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    return list(config["tool"]["importlinter"]["contracts"])


def _layer_names(contract: dict[str, object]) -> set[str]:
    layers = contract["layers"]
    assert isinstance(layers, list)
    return {name.strip("() ") for layer in layers for name in layer.split("|")}


def _children(folder: Path) -> set[str]:
    """The modules and subpackages directly in ``folder`` (``__init__``/``__main__`` aside)."""
    modules = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return modules | {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}


def test_every_top_level_module_and_folder_is_in_a_layer_of_the_package_contract() -> None:
    package = next(c for c in _contracts() if c.get("type") == "layers" and not c.get("containers"))
    named = {name.removeprefix("chongming_redis.") for name in _layer_names(package)}
    assert _children(ROOT / "chongming_redis") - named == set()
    assert named - _children(ROOT / "chongming_redis") == set()  # no stale names either


def _folder_contracts() -> dict[str, set[str]]:
    """``{folder: the module names its contracts place}``: a ``layers`` contract's containers,
    an ``independence`` contract's modules (all of one folder)."""
    placed: dict[str, set[str]] = {}
    for contract in _contracts():
        for container in contract.get("containers", ()):  # type: ignore[attr-defined]
            placed.setdefault(container, set()).update(_layer_names(contract))
        if contract.get("type") == "independence":
            for module in contract["modules"]:  # type: ignore[attr-defined]
                folder, _, name = module.rpartition(".")
                placed.setdefault(folder, set()).add(name)
    return placed


def test_every_folder_has_a_contract_that_places_each_of_its_modules() -> None:
    """Every folder of the package (the root aside: the package contract places its modules)
    has a contract of its own, and it orders all of the folder's modules: none is unchecked."""
    placed = _folder_contracts()
    folders = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "chongming_redis").rglob("__init__.py")
    } - {"chongming_redis"}
    assert folders - set(placed) == set(), "folders without a contract"
    unplaced = {
        folder: sorted(missing)
        for folder, names in placed.items()
        if (missing := _children(ROOT / Path(*folder.split("."))) - names)
    }
    assert unplaced == {}


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "chongming_redis").rglob("__init__.py")
    }
    assert on_disk - listed == set()
    # Listed beside them: the scripts (lua/, mapped in) and the dashboard's data folders.
    assert listed - on_disk == {"chongming_redis.lua", "chongming_redis.lua.lib",
                                "chongming_redis.dashboard.static",
                                "chongming_redis.dashboard.templates"}  # fmt: skip


def test_every_asyncio_twin_is_x_async_beside_x_with_classes_named_async_x() -> None:
    """One naming rule for twins: ``x_async.py`` sits beside ``x.py``, and each class it
    defines is ``AsyncX`` for a class ``X`` of ``x.py`` (``AsyncClient`` of ``Client``)."""
    twins = sorted((ROOT / "chongming_redis").rglob("*_async.py"))
    assert twins, "no twins found"
    mismatched = {}
    for twin in twins:
        sync = twin.with_name(twin.name.removesuffix("_async.py") + ".py")
        assert sync.is_file(), f"{twin.relative_to(ROOT)} has no sync module beside it"
        sync_classes = _classes(sync)
        for name in _classes(twin):
            if not (name.startswith("Async") and name.removeprefix("Async") in sync_classes):
                mismatched.setdefault(str(twin.relative_to(ROOT)), []).append(name)
    assert mismatched == {}


def _classes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


def test_the_async_store_keeps_its_name_from_before_the_twin_rule() -> None:
    from chongming_redis.stores.redis_async import AsyncRedisStore, AsyncRedisTaskStore

    assert AsyncRedisStore is AsyncRedisTaskStore
