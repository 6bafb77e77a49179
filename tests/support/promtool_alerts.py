"""The chart's alert rules evaluated by Prometheus' own engine (`promtool test rules`) on
scrapes of real sidecars.

`ScrapeRecorder` scrapes every sidecar's /metrics at a fixed period while a scenario runs,
each under the `job`, `pod` and `rsub_region` labels Prometheus would add (the last by the
chart's ServiceMonitor), with Prometheus' own `up` series per target (0 when the scrape
fails; none for a target no longer listed, as for a pod that is gone), and marks the instants
a scenario names. `promtool_check` writes the recorded series as a promtool unit test (`input_series`,
one value per scrape, `_` where a target did not answer) with one check per expectation and
runs promtool on it.

Time is stretched: each scrape stands for `SCRAPE_INTERVAL` of promtool's time, so the
rules' windows (`rate(...[5m])`) and `for:` durations span a few seconds of the scenario
(10 scrapes for 5m). Thresholds in seconds or messages are the chart's values, set to the
scenario's scale when the rules are rendered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / ".tools" / "prometheus" / "promtool"
SCRAPE_INTERVAL_S = 30  # promtool time per scrape
SCRAPE_PERIOD_S = 0.5  # real time between scrapes

Series = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


@dataclass(frozen=True)
class Target:
    job: str
    pod: str
    url: str  # the /metrics URL
    region: str

    def labels(self) -> dict[str, str]:
        """The labels Prometheus puts on every series of this target."""
        return {"job": self.job, "pod": self.pod, "rsub_region": self.region}


@dataclass(frozen=True)
class Expect:
    """At the scrape `at`, `alert` fires (state firing, `for:` passed) with at least `labels`
    (`fires=False`: it does not); without `alert`, no alert at all is pending or firing."""

    at: int
    alert: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    fires: bool = True

    def samples(self) -> list[dict[str, Any]]:
        return [{"labels": "{}", "value": 1}] if self.alert and self.fires else []

    def promql(self) -> str:
        if not self.alert:
            return "ALERTS"
        wanted = {"alertname": self.alert, "alertstate": "firing", **self.labels}
        matchers = ", ".join(f"{k}={json.dumps(v)}" for k, v in wanted.items())
        return f"group(ALERTS{{{matchers}}})"


class ScrapeRecorder:
    """Scrapes `targets` every `SCRAPE_PERIOD_S` while running (`async with recording()`)."""

    def __init__(self, targets: list[Target]) -> None:
        self.targets = list(targets)
        self.scrapes: list[dict[Series, float]] = []
        self._scraped = asyncio.Condition()

    @property
    def now(self) -> int:
        """The index of the last scrape recorded (what an `Expect` is evaluated at)."""
        return len(self.scrapes) - 1

    def add(self, target: Target) -> None:
        self.targets.append(target)

    def remove(self, pod: str) -> None:
        self.targets = [t for t in self.targets if t.pod != pod]

    async def scrape_once(self, http: aiohttp.ClientSession) -> None:
        found: dict[Series, float] = {}
        targets = list(self.targets)
        answers = await asyncio.gather(
            *(self._scrape(http, target) for target in targets), return_exceptions=True
        )
        for target, answer in zip(targets, answers, strict=True):
            if not isinstance(answer, BaseException):
                found.update(answer)
            up = float(not isinstance(answer, BaseException))
            found[("up", tuple(sorted(target.labels().items())))] = up
        async with self._scraped:
            self.scrapes.append(found)
            self._scraped.notify_all()

    @staticmethod
    async def _scrape(http: aiohttp.ClientSession, target: Target) -> dict[Series, float]:
        async with http.get(target.url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
            text = await resp.text()
        extra = target.labels()
        return {
            (s.name, tuple(sorted({**s.labels, **extra}.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    @contextlib.asynccontextmanager
    async def recording(self) -> AsyncIterator[ScrapeRecorder]:
        async def loop(http: aiohttp.ClientSession) -> None:
            while True:
                await self.scrape_once(http)
                await asyncio.sleep(SCRAPE_PERIOD_S)

        async with aiohttp.ClientSession() as http:
            task = asyncio.create_task(loop(http))
            try:
                yield self
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def wait_scrapes(self, count: int) -> int:
        """Wait until `count` more scrapes are recorded; the index of the last one."""
        until = len(self.scrapes) + count
        async with asyncio.timeout(count * SCRAPE_PERIOD_S + 30), self._scraped:
            await self._scraped.wait_for(lambda: len(self.scrapes) >= until)
        return until - 1

    def value(self, name: str, **labels: str) -> float | None:
        """The sum of `name`'s samples with `labels` in the last scrape (None: none)."""
        wanted = set(labels.items())
        found = [v for (n, ls), v in self.scrapes[-1].items() if n == name and wanted <= set(ls)]
        return sum(found) if found else None

    def input_series(self) -> list[dict[str, str]]:
        """Each series' values, one per scrape: a series gone from a scrape gets a staleness
        marker (`stale`), as Prometheus writes for a series that vanishes (a failed scrape, a
        target no longer listed), so a query no longer sees it; `_` (no sample) after that."""
        names = sorted({key for scrape in self.scrapes for key in scrape})
        return [
            {
                "series": f"{name}{{{','.join(f'{k}={json.dumps(v)}' for k, v in labels)}}}",
                "values": " ".join(self._values((name, labels))),
            }
            for name, labels in names
        ]

    def _values(self, key: Series) -> Iterator[str]:
        present = False
        for scrape in self.scrapes:
            if key in scrape:
                yield repr(scrape[key])
            else:
                yield "stale" if present else "_"
            present = key in scrape


def promtool_test(rules_file: Path, recorder: ScrapeRecorder, expects: list[Expect]) -> Any:
    """A promtool unit-test file's content: the recording, one check per expectation."""
    step = f"{SCRAPE_INTERVAL_S}s"
    return {
        "rule_files": [str(rules_file)],
        "evaluation_interval": step,
        "tests": [
            {
                "interval": step,
                "input_series": recorder.input_series(),
                "promql_expr_test": [
                    {
                        "expr": expect.promql(),
                        "eval_time": f"{expect.at * SCRAPE_INTERVAL_S}s",
                        "exp_samples": expect.samples(),
                    }
                    for expect in expects
                ],
            }
        ],
    }


def promtool_check(
    rules: Mapping[str, Any], recorder: ScrapeRecorder, expects: list[Expect], workdir: Path
) -> tuple[int, str]:
    """Run `promtool test rules` on the recording: (exit code, its output). The files stay
    in `workdir` for a look when it fails."""
    assert PROMTOOL.exists(), f"{PROMTOOL} is missing: `make promtool` unpacks it"
    rules_file = workdir / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(dict(rules), sort_keys=False))
    test_file = workdir / "alerts-test.yaml"
    test_file.write_text(
        yaml.safe_dump(promtool_test(rules_file, recorder, expects), sort_keys=False)
    )
    result = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return result.returncode, f"{test_file}:\n{result.stdout}{result.stderr}"
