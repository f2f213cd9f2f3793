"""Scenario files as pytest items: ``pytest examples/scenarios/`` runs every
scenario, one item per file, through the scenario runner
``prism-debug scenario run`` uses; each expectation's verdict is reported
(a failure lists them all; ``-rP`` shows a passing one's; JUnit gets them as
properties)."""

from __future__ import annotations

import fnmatch
import re
import tempfile
from pathlib import Path

import pytest

from prism_debug.scenario import load_scenario
from prism_debug.workflows.scenario_run import ScenarioResult, run_scenario

# a scenario file has these at its top level (other YAML in a test tree is left alone)
_SCENARIO_KEYS = (re.compile(r"^world\s*:", re.MULTILINE), re.compile(r"^run\s*:", re.MULTILINE))
_MAX_SCENARIO_BYTES = 1 << 20


def is_scenario_file(path: Path, patterns: list[str]) -> bool:
    if path.suffix not in (".yaml", ".yml"):
        return False
    if not any(fnmatch.fnmatch(path.name, p) for p in patterns):
        return False
    try:
        with path.open("rb") as f:
            text = f.read(_MAX_SCENARIO_BYTES).decode("utf-8", "replace")
    except OSError:
        return False
    return all(key.search(text) for key in _SCENARIO_KEYS)


class ScenarioFailed(Exception):
    def __init__(self, result: ScenarioResult) -> None:
        super().__init__(result.scenario.name)
        self.result = result


class ScenarioFile(pytest.File):
    def collect(self):
        yield ScenarioItem.from_parent(self, name=self.path.stem)


class ScenarioItem(pytest.Item):
    def runtest(self) -> None:
        scenario = load_scenario(self.path)  # ScenarioError: every problem, by line
        lines: list[str] = []
        result = run_scenario(scenario, lines.append, run_dir=self._run_dir(),
                              store=self.config.getoption("prism_store"))
        for verdict in result.verdicts:
            self.user_properties.append(("expect", verdict.line()))
        if result.predicted_ratio is not None:
            self.user_properties.append(("predicted_ratio", f"{result.predicted_ratio:.4f}"))
        self.user_properties.append(("run_dir", str(result.run_dir)))
        if not result.passed:
            raise ScenarioFailed(result)  # its report lists every verdict
        self.add_report_section("call", "expectations", "\n".join(
            [v.line() for v in result.verdicts] + [f"run folder: {result.run_dir}"]))

    def _run_dir(self) -> Path:
        factory = getattr(self.config, "_tmp_path_factory", None)
        if factory is not None:
            return factory.mktemp(f"scenario-{self.path.stem}", numbered=True)
        return Path(tempfile.mkdtemp(prefix=f"prism-scenario-{self.path.stem}-"))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ScenarioFailed):
            result = excinfo.value.result
            return "\n".join([f"scenario {result.scenario.name} ({self.path}):"]
                             + [v.line() for v in result.verdicts]
                             + [f"run folder: {result.run_dir}"])
        if type(excinfo.value).__module__.startswith("prism_debug"):
            return f"{self.path}: {excinfo.value}"  # a PrismError says what to do
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, 0, f"scenario: {self.name}"
