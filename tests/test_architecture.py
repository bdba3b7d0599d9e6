"""The import rules of docs/architecture.md, as the contracts in pyproject.toml state them: arrows point
down, the faces stay apart, Qt only in app, torch only in nn and the benchmark's baselines, no import
cycles."""

import ast
import importlib
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_imports_keep_the_contracts():
    # The one beside this interpreter: the import-linter of the environment the tests run in.
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports, "lint-imports is not installed: pip install -e '.[dev]'"
    # Run from the root, where it finds this checkout's cellfuse first; no cache, so nothing is written.
    result = subprocess.run([lint_imports, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    print(result.stdout, result.stderr)  # shown in full when the test fails
    assert result.returncode == 0, "an import breaks a contract: the report is in the captured stdout"


def test_every_name_the_tests_and_benchmarks_import_from_cellfuse_exists():
    """Most GPU tests and probes run only on a GPU machine, and an import inside one of them that a
    change of the library left behind fails only there: every `from cellfuse... import name` in tests/
    and benchmarks/ (inside functions too) is checked here against the library as it is."""
    missing = []
    for path in sorted([*ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "cellfuse"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                submodule = hasattr(module, "__path__") and importlib.util.find_spec(
                    f"{node.module}.{alias.name}") is not None
                if not hasattr(module, alias.name) and not submodule:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
    assert not missing, "imported and not in the library:\n" + "\n".join(missing)
