"""The wheel: its distribution name, the `zoo` command, and every module of the package.

Built offline (`pip wheel --no-build-isolation`, from a copy of the sources so the checkout gets
no build/ or egg-info folders) with the setuptools of the running environment.
"""

from __future__ import annotations

import configparser
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from zoo.extras import DISTRIBUTION

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    for tool in ("pip", "setuptools"):
        if importlib.util.find_spec(tool) is None:
            pytest.skip(f"building the wheel needs {tool}: pip install {tool}")
    source = tmp_path_factory.mktemp("source")
    shutil.copy(ROOT / "pyproject.toml", source)
    shutil.copy(ROOT / "README.md", source)
    shutil.copytree(ROOT / "zoo", source / "zoo", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    command += ["--no-index", "-q", "-w", str(out), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def dist_info_file(wheel: zipfile.ZipFile, name: str) -> str:
    (path,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(path).decode()


@pytest.mark.slow
def test_wheel_metadata_names_the_distribution(wheel):
    metadata = dist_info_file(wheel, "METADATA").splitlines()
    assert "Name: jax-transformer-zoo" in metadata
    assert f"Name: {DISTRIBUTION}" in metadata
    assert Path(wheel.filename).name.startswith("jax_transformer_zoo-0.1.0-py3-none-any")


@pytest.mark.slow
def test_wheel_installs_the_zoo_command(wheel):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(dist_info_file(wheel, "entry_points.txt"))
    assert entry_points.sections() == ["console_scripts"]
    assert dict(entry_points["console_scripts"]) == {"zoo": "zoo.cli:main"}


@pytest.mark.slow
def test_wheel_holds_every_module(wheel):
    modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "zoo").rglob("*.py")}
    packed = {name for name in wheel.namelist() if name.endswith(".py")}
    assert len(modules) > 100
    assert packed == modules
