"""The monitoring kit in deploy/: alert rules under promtool, and every Grafana dashboard query
evaluated by a real Prometheus scraping a real ``framebatch run``."""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from streams.embedded_redis import free_tcp_port
from tests.conftest import MODEL_ANY_SIZE, REPO_ROOT, VIDEOS
from tests.integration.runner import write_config

pytestmark = pytest.mark.integration

ALERTS = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERTS_TEST = REPO_ROOT / "deploy" / "prometheus" / "alerts_test.yml"
PROMETHEUS_EXAMPLE = REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "framebatch.json"
HIGHWAY = VIDEOS / "highway_traffic_960x540_30fps.mp4"
HIGHWAY_ANALYTICS = {
    "tracker": {},
    "lines": {"gate": {"start": [100, 300], "end": [860, 300]}},
    "zones": {"near": {"polygon": [[150, 250], [800, 250], [960, 540], [0, 540]]}},
}

#: Grafana's built-in interval variables, as a 1 s scrape and a ~minute-long run need them.
BUILTINS = {"__rate_interval": "10s", "__interval": "2s", "__range": "1m"}
#: Dashboard queries whose series exist only when something is wrong or on other hardware:
#: (a substring of the query, why it may be empty here). Every other query must have data.
EMPTY_BY_DESIGN = {
    "framebatch_gpu_": "GPU metrics come from NVML, only when the detector runs on GPUs",
    "framebatch_stage_failures_total": "no series until a batch worker stage has died",
}
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)", re.DOTALL)
RANGE_FUNCTIONS = re.compile(r"\b(rate|irate|increase|deriv|\w+_over_time)\((?:[^()]|\([^()]*\))*")


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not on PATH (Debian/Ubuntu: apt-get install prometheus)")
    return path


@pytest.fixture(scope="module")
def promtool() -> str:
    return require("promtool")


def promtool_run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)


def test_alert_rules_are_valid(promtool):
    result = promtool_run(promtool, "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_pass_their_unit_tests(promtool):
    result = promtool_run(promtool, "test", "rules", str(ALERTS_TEST))
    assert result.returncode == 0, result.stdout + result.stderr


def test_example_prometheus_config_is_valid(promtool):
    result = promtool_run(promtool, "check", "config", str(PROMETHEUS_EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr


def alert_names() -> set[str]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"] for group in groups for rule in group["rules"] if "alert" in rule}


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(ALERTS_TEST.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert alert_names() - firing == set()
    assert alert_names() - quiet == set()


def dashboard_targets(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(panel title, target) of every query, panels inside collapsed rows included."""
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                yield f"{inner['title']} [{target.get('refId')}]", target


def test_dashboard_is_importable_and_rate_windows_follow_the_scrape_interval():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    targets = list(dashboard_targets(dashboard))
    assert len(targets) > 20
    for name, target in targets:
        assert target["datasource"]["uid"] == "${datasource}", name
        for window in re.findall(r"\[([^\]]*)\]", target["expr"]):
            assert window in ("$__rate_interval", "$__range"), f"{name}: [{window}]"
        for call in RANGE_FUNCTIONS.finditer(target["expr"]):
            assert "[$__" in call.group(0), f"{name}: {call.group(0)} has no range window"


@dataclass
class Prometheus:
    url: str

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:  # a bad query: 400 with Prometheus' error
            raise AssertionError(f"{path} {params}: {exc.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)["result"]

    def label_values(self, label: str, selector: str) -> list[str]:
        return self.get(f"/api/v1/label/{label}/values", **{"match[]": selector})


def has_value(result: list[dict[str, Any]]) -> bool:
    """At least one sample that is a number (a quantile of nothing is NaN)."""
    return any(math.isfinite(float(series["value"][1])) for series in result)


def substitute(expr: str, values: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in values:
            raise AssertionError(f"unknown variable ${name} in {expr!r}")
        return values[name]

    return VARIABLE.sub(value, expr)


def resolve_variables(prometheus: Prometheus, dashboard: dict[str, Any]) -> dict[str, str]:
    """The dashboard's query variables as Grafana would fill them: All where allowed."""
    values = dict(BUILTINS)
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        match = LABEL_VALUES.fullmatch(query["query"] if isinstance(query, dict) else query)
        assert match, f"variable {variable['name']}: expected label_values(selector, label)"
        selector, label = match.groups()
        found = prometheus.label_values(label, substitute(selector, values))
        assert found, f"variable {variable['name']}: no values for {selector}"
        values[variable["name"]] = variable["allValue"] if variable.get("includeAll") else found[0]
    return values


def stop(process: subprocess.Popen[Any], timeout: float) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def wait_for(url: str, process: subprocess.Popen[Any], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited {process.returncode}:\n{log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout:g} s:\n{log.read_text()[-3000:]}")


@dataclass
class Stack:
    prometheus: Prometheus
    daemon: subprocess.Popen[bytes]
    daemon_log: Path


@pytest.fixture
def stack(assets, redis_url, prefix, tmp_path) -> Iterator[Stack]:
    """``framebatch run`` (one looping camera with a line and a zone, and one whose frames all
    go stale, so that the analytics and drop panels have data) scraped every second by
    ``prometheus`` with the real alert rules."""
    prometheus_bin = require("prometheus")
    if not MODEL_ANY_SIZE.is_file():
        pytest.skip(f"model not found: {MODEL_ANY_SIZE}")
    daemon_port, prometheus_port = free_tcp_port(), free_tcp_port()
    loop = {"url": str(HIGHWAY), "loop": True, "realtime": True}
    config = write_config(
        tmp_path / "framebatch.yaml",
        model=MODEL_ANY_SIZE,
        cameras=[
            # cars cross its line and drive through its zone: the analytics panels' data
            {"id": "highway", **loop, "fps": 8, "analytics": HIGHWAY_ANALYTICS},
            # 1 ms is over before the frame reaches the batcher: every frame drops as stale
            {"id": "late", **loop, "fps": 2, "max_frame_age_ms": 1},
        ],
        redis_url=redis_url,
        prefix=prefix,
        http={"listen": f"127.0.0.1:{daemon_port}"},
    )
    scrape = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "framebatch",
                "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(scrape))
    daemon_log, prometheus_log = tmp_path / "framebatch.log", tmp_path / "prometheus.log"
    with daemon_log.open("wb") as daemon_out, prometheus_log.open("wb") as prometheus_out:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "run", str(config)],
            stdout=daemon_out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
        server = subprocess.Popen(
            [
                prometheus_bin,
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prometheus_port}",
                "--log.level=warn",
            ],
            stdout=prometheus_out,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{prometheus_port}"
        wait_for(f"{url}/-/ready", server, prometheus_log, timeout=20)
        wait_for(f"http://127.0.0.1:{daemon_port}/metrics", daemon, daemon_log, timeout=30)
        yield Stack(Prometheus(url), daemon, daemon_log)
    finally:
        stop(server, timeout=10)
        code = stop(daemon, timeout=60)
    log = daemon_log.read_text()
    assert code == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


def poll(
    prometheus: Prometheus, dashboard: dict[str, Any], targets: list[tuple[str, Any]]
) -> tuple[list[str], list[tuple[str, str, str | None]], dict[str, Any], list[dict[str, Any]]]:
    """Every target's result; the names of those without data (excused ones aside) and the
    alert rules not evaluated healthy yet. Before 10 scrapes, everything counts as empty."""
    rules = [r for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
    unhealthy = [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    # 10 scrapes at least, so that rates and quantiles see a stretch of running
    scrapes = prometheus.query('count_over_time(up{job="framebatch"}[1m])')
    count = float(scrapes[0]["value"][1]) if scrapes else 0
    if count < 10:
        return [f"{count:g} scrapes so far (waiting for 10)"], unhealthy, {}, rules
    values = resolve_variables(prometheus, dashboard)
    empty, results = [], {}
    for name, target in targets:
        expr = substitute(target["expr"], values)
        results[name] = result = prometheus.query(expr)
        excused = any(key in expr for key in EMPTY_BY_DESIGN)
        if not excused and not has_value(result):
            empty.append(f"{name}: {expr}")
    return empty, unhealthy, results, rules


def test_every_dashboard_query_has_data_from_a_live_daemon(stack):
    prometheus = stack.prometheus
    dashboard = json.loads(DASHBOARD.read_text())
    targets = list(dashboard_targets(dashboard))
    unused = [key for key in EMPTY_BY_DESIGN if not any(key in t["expr"] for _, t in targets)]
    assert unused == [], "EMPTY_BY_DESIGN names queries the dashboard no longer has"
    deadline = time.monotonic() + 45
    while True:
        empty, unhealthy, results, rules = poll(prometheus, dashboard, targets)
        if not empty and not unhealthy:
            break
        if time.monotonic() > deadline:
            pytest.fail(
                "after 45 s, queries without data:\n"
                + "\n".join(empty)
                + f"\nrules not ok: {unhealthy}"
                + f"\ndaemon log:\n{stack.daemon_log.read_text()[-2000:]}"
            )
        time.sleep(1)
    assert {r["name"] for r in rules if r["type"] == "alerting"} == alert_names()
    # the data is the pipeline's: the looping camera's frames are detected, the late one's drop
    drops = results["Drops by cause (frames/s) [A]"]
    assert {(s["metric"]["camera"], s["metric"]["cause"]) for s in drops} >= {("late", "stale")}
    processed = {
        s["metric"]["camera"]: float(s["value"][1])
        for s in results["Frames/s per camera (processed) [A]"]
    }
    assert processed["highway"] > 0 and processed["late"] == 0
    up = {s["metric"]["camera"]: s["value"][1] for s in results["Camera up [A]"]}
    assert up == {"highway": "1", "late": "1"}
    states = {s["metric"]["camera"]: s["metric"]["state"] for s in results["Camera state [A]"]}
    assert states == {"highway": "running", "late": "running"}
    assert [s["value"][1] for s in results["Redis up [A]"]] == ["1"]
