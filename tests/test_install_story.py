"""The install story: the unit's documentation is installed, the missing-torch remedy points at the
README's PyTorch section, the example profile says what it does."""

from __future__ import annotations

import fnmatch
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
PREFIX = "file:///opt/gpud/"  # docs/deployment.md installs into the virtual environment /opt/gpud


def test_unit_documentation_points_at_installed_files() -> None:
    unit = (REPO / "systemd" / "gpud.service").read_text()
    uris = next(line for line in unit.splitlines() if line.startswith("Documentation=")).split("=", 1)[1].split()
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    assert uris
    for uri in uris:
        assert uri.startswith(PREFIX), uri
        installed = uri.removeprefix(PREFIX)
        where, _, name = installed.rpartition("/")
        sources = [s for s in data_files.get(where, []) if fnmatch.fnmatch(name, Path(s).name)]
        assert sources, f"{uri}: no [tool.setuptools.data-files] entry installs it"
        assert any((REPO / Path(s).parent / name).is_file() for s in sources), uri
    assert "/opt/gpud" in (REPO / "docs" / "deployment.md").read_text()


def test_missing_torch_remedy_points_at_the_readme(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpud.probe import runner
    from gpud.probe.errors import ProbeError

    monkeypatch.setattr(runner, "torch_available", lambda: False)
    with pytest.raises(ProbeError) as err:
        runner.run_probe(device="cpu", gpus=0)
    assert "PyTorch for the probe" in err.value.remedy and "gpud[probe]" not in err.value.remedy
    readme = (REPO / "README.md").read_text()
    assert "### PyTorch for the probe" in readme and "download.pytorch.org/whl/cpu" in readme
    assert "[probe]" not in readme


def test_example_profile_says_what_it_does() -> None:
    from gpud.profiles.profile import load

    p = load(str(REPO / "gpud" / "profiles" / "builtin" / "z8-fury-4x-a6000-example.toml"))
    assert p.description.startswith("Example to copy and adapt") and "280 W" in p.description
