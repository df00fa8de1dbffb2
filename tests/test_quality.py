"""The code stays ruff- and mypy-clean, and the README's commands are the ones CI runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import REPO


def _tool(name: str) -> str:
    path = shutil.which(name, path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is missing (it is in the [test] extra)")
        pytest.skip(f"{name} not installed: pip install -e '.[test]'")
    return path


def test_ruff_clean() -> None:
    r = subprocess.run([_tool("ruff"), "check", "gpud", "tests", "grafana", "benchmarks"], capture_output=True,
                       text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.long
def test_mypy_clean() -> None:
    r = subprocess.run([_tool("mypy"), "gpud"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr


def _readme_command(marker: str) -> str:
    text = (REPO / "README.md").read_text()
    m = re.search(rf"<!-- {marker} -->\n```sh\n(.*?)\n```", text, re.S)
    assert m, f"README.md has no {marker}"
    return m.group(1)


def test_readme_has_the_two_commands_and_ci_runs_the_test_one() -> None:
    main = _readme_command("main-command")
    test = _readme_command("test-command")
    assert "z8-fury-4x-a6000" in main and "pip install" in main
    assert "pytest" in test and "pip install" in test
    ci = (REPO / ".ci" / "run").read_text()
    # CI prepares nothing in README's environment: the command installs what it needs itself.
    assert "test-command" in ci and ".venv/bin/" not in ci
    # The torch the probe's tests run on comes from the [test] extra, pinned to the oldest allowed.
    project = (REPO / "pyproject.toml").read_text()
    floor = re.search(r'probe = \["torch>=([\d.]+)"', project)
    assert floor and f'"torch=={floor.group(1)}.0"' in project


def test_ci_checks_the_lowest_nvidia_ml_py_that_pyproject_allows() -> None:
    bound = re.search(r'"nvidia-ml-py>=([\d.]+)"', (REPO / "pyproject.toml").read_text())
    pinned = re.search(r"LOWEST_NVML_PY=([\d.]+)", (REPO / ".ci" / "run").read_text())
    assert bound and pinned and pinned.group(1).startswith(bound.group(1) + ".")


def test_import_contracts_hold() -> None:
    """The layers of docs/architecture.md, checked by import-linter (contracts in pyproject.toml)."""
    r = subprocess.run([_tool("lint-imports")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr
    assert "0 broken" in r.stdout
