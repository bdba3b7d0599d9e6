"""The import rules of docs/architecture.md, as the contracts in pyproject.toml state them: arrows point
down, the faces stay apart, Qt only in app, torch only in nn and the benchmark's baselines, no import
cycles."""

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
