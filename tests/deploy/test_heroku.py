"""The Heroku conventions: app.json, the Procfile and the settings describe one deployment."""

from __future__ import annotations

import importlib
import json
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from config.datasets import load_datasets
from config.settings import REQUIRED_VARIABLES, Settings

ROOT = Path(__file__).resolve().parents[2]
ADDON_VARIABLES = {"heroku-postgresql": "DATABASE_URL", "heroku-redis": "REDIS_URL"}
PLATFORM_VARIABLES = {"PORT"}  # Heroku sets it for every web dyno


class RecordingEnvironment(Mapping[str, str]):
    """An empty environment that remembers every variable the settings ask for."""

    def __init__(self) -> None:
        self.asked: set[str] = set()

    def __getitem__(self, key: str) -> str:
        """Nothing is set."""
        self.asked.add(key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        """Note the name; nothing is set."""
        self.asked.add(key)
        return default

    def __iter__(self) -> Iterator[str]:
        """No variables."""
        return iter(())

    def __len__(self) -> int:
        """No variables."""
        return 0


def app_json() -> dict[str, Any]:
    """The Deploy button's manifest."""
    manifest: dict[str, Any] = json.loads((ROOT / "app.json").read_text())
    return manifest


def procfile() -> dict[str, str]:
    """The Procfile's process types and their commands."""
    processes: dict[str, str] = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            processes[name.strip()] = command.strip()
    return processes


def variables_read_by_settings() -> set[str]:
    """Every environment variable the settings look at."""
    env = RecordingEnvironment()
    Settings.from_env(env)
    return env.asked


def test_every_required_variable_is_declared_or_provided_by_an_add_on() -> None:
    """A Deploy button asks for, generates or provisions each variable a deployment needs."""
    manifest = app_json()
    provided = {
        ADDON_VARIABLES[addon["plan"].partition(":")[0]]
        for addon in manifest["addons"]
        if addon["plan"].partition(":")[0] in ADDON_VARIABLES
    }
    assert provided == {"DATABASE_URL", "REDIS_URL"}
    for name in REQUIRED_VARIABLES:
        if name in provided:
            assert name not in manifest["env"], f"{name} comes from its add-on"
            continue
        declared = manifest["env"].get(name)
        assert declared is not None, f"app.json does not declare {name}"
        assert declared["required"] is True, name
        assert "value" in declared or "generator" in declared or name == "WEBSCRAPER_API_TOKEN"


def test_the_tokens_scrapesync_checks_are_generated_secrets() -> None:
    """The notification and status tokens are long random values Heroku makes, never defaults."""
    env = app_json()["env"]
    for name in ("WEBHOOK_TOKEN", "SCRAPESYNC_STATUS_TOKEN"):
        assert env[name]["generator"] == "secret"
        assert "value" not in env[name]


def test_every_declared_variable_is_read_by_the_settings_and_described() -> None:
    """app.json asks only for variables scrapesync reads: a setting or a destination's secret."""
    read = variables_read_by_settings()
    assert set(REQUIRED_VARIABLES) <= read
    secrets = {
        destination.secret_env
        for dataset in load_datasets(ROOT / "config" / "datasets.toml")
        for destination in dataset.destinations
        if destination.secret_env
    }
    for name, spec in app_json()["env"].items():
        assert name in read | secrets, f"app.json declares {name}, which nothing reads"
        assert len(spec["description"]) > 20, name


def test_every_process_of_the_formation_exists_in_the_procfile() -> None:
    """Heroku scales web and worker from the Procfile and runs its release line on each deploy."""
    processes = procfile()
    formation = app_json()["formation"]
    assert set(formation) == {"web", "worker"}
    assert set(formation) <= set(processes)
    assert all(spec["quantity"] >= 1 for spec in formation.values())
    assert processes["release"] == "scrapesync db upgrade"
    assert "release" not in formation


def test_the_procfile_commands_name_code_and_variables_that_exist() -> None:
    """The web factory and the worker class import, and each $VARIABLE is one Heroku sets."""
    processes = procfile()
    factory = re.search(r'"(\w+):(\w+)\(\)"', processes["web"])
    assert factory is not None
    assert callable(getattr(importlib.import_module(factory[1]), factory[2]))
    worker = shlex.split(processes["worker"])
    module, _, name = worker[worker.index("--worker-class") + 1].rpartition(".")
    assert isinstance(getattr(importlib.import_module(module), name), type)
    manifest = app_json()
    known = set(manifest["env"]) | set(ADDON_VARIABLES.values()) | PLATFORM_VARIABLES
    for command in processes.values():
        for variable in re.findall(r"\$\{?(\w+)", command):
            assert variable in known, f"the Procfile uses ${variable}, which nobody sets"


def test_the_python_buildpack_finds_the_version_and_the_project() -> None:
    """heroku/python installs the project itself with the Python that pyproject allows."""
    assert [b["url"] for b in app_json()["buildpacks"]] == ["heroku/python"]
    version = (ROOT / ".python-version").read_text().strip()
    major, minor = (int(part) for part in version.split(".")[:2])
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    floor = re.fullmatch(r">=(\d+)\.(\d+)", pyproject["project"]["requires-python"])
    assert floor is not None
    assert (major, minor) >= (int(floor[1]), int(floor[2]))
    requirements = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert requirements == ["."]
