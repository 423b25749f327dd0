"""What the Grafana dashboards in infra/grafana/dashboards query: their PromQL expressions, the metric
names and label matchers in them, and Prometheus' text format as a service exports it. Enough PromQL
to read the dashboards' own expressions, not a general parser."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "infra" / "grafana" / "dashboards"

# Words that are PromQL, not metric names (functions and aggregations are told by the "(" after them).
KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "start",
    "end",
}
# Series Prometheus makes itself for every target, whoever exports what.
SYNTHETIC = {
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
}
# Grafana's variables, as Grafana would expand them for an "All" selection over the last hour.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "1h", "$pool": ".*", "$tenant": ".*"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:$])[A-Za-z_:][\w:]*")
_SELECTOR = re.compile(r"([A-Za-z_:][\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)")


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel: str
    expr: str


def load_generator():
    """infra/grafana/build.py as a module (infra/ is not a Python package)."""
    spec = importlib.util.spec_from_file_location("lpx_grafana_build", ROOT / "infra" / "grafana" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_dashboards() -> dict[str, dict]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def queries(name: str, board: dict) -> Iterator[Query]:
    """Every PromQL expression of a dashboard: panel targets, and the metric behind each variable."""
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield Query(name, panel["title"], target["expr"])
    for var in board.get("templating", {}).get("list", []):
        found = re.fullmatch(r"label_values\(\s*([^,\s]+)\s*,\s*\w+\s*\)", var["query"]["query"])
        assert found, f"{name}: variable {var['name']} is not a label_values(metric, label) query"
        yield Query(name, f"variable {var['name']}", found.group(1))


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = _LABEL_LISTS.sub(" ", text)  # by (...), on (...), group_left (...)
    names = set()
    for found in _IDENT.finditer(text):
        name = found.group()
        if name.lower() in KEYWORDS or text[found.end() :].lstrip().startswith("("):
            continue  # a keyword, or a function or aggregation
        names.add(name)
    return names


def matched_labels(expr: str) -> dict[str, set[str]]:
    """metric name -> the labels its selectors match on (`name{label=~"..."}`)."""
    found: dict[str, set[str]] = {}
    for name, body in _SELECTOR.findall(_STRING.sub('""', expr)):  # no "}" inside a label value
        found.setdefault(name, set()).update(_MATCHER.findall(body))
    return found


def for_prometheus(expr: str) -> str:
    for var, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a Grafana variable this test does not know: {expr}"
    return expr


def parse_exposition(text: str) -> dict[str, set[str]]:
    """Prometheus text format -> sample name (with its _total/_bucket/... suffix) -> its label names."""
    samples: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        found = re.match(r"([A-Za-z_:][\w:]*)(\{(.*)\})?\s", line)
        assert found, f"not a sample line: {line!r}"
        labels = set(re.findall(r'([A-Za-z_]\w*)="', found.group(3) or ""))
        samples.setdefault(found.group(1), set()).update(labels)
    return samples
