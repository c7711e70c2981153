"""What ships sets the gateway by its current names: every `SR_GATEWAY_*` variable and every `sr-gateway serve`
flag in the rendered k8s manifests (k8s/render.py) and the control plane's catalog (the KServe runtime it
creates) is a setting of gateway.settings, not a deprecated `_seconds` alias or a typo that would fail the start.
No cluster needed: these read the files."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.settings import Settings
from k8s.render import TARGETS, render

ROOT = Path(__file__).resolve().parents[2]
ENV = re.compile(r"SR_GATEWAY_[A-Z0-9_]+")
# read by `models build` / `models tune` (gateway/cli.py), not by `serve`
OTHER_COMMANDS = {"SR_GATEWAY_ENGINE", "SR_GATEWAY_PRECISION", "SR_GATEWAY_MODEL_STORE",
                  "SR_GATEWAY_MODEL_STORE_MAX_GIB"}


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)
    elif isinstance(node, str):
        yield node


def _serve_args(node: Any) -> Iterator[list[str]]:
    """The args of every container that runs `sr-gateway serve`."""
    if isinstance(node, dict):
        args = node.get("args")
        if isinstance(args, list) and args[:1] == ["serve"]:
            yield [str(a) for a in args]
        for value in node.values():
            yield from _serve_args(value)
    elif isinstance(node, list):
        for item in node:
            yield from _serve_args(item)


def shipped() -> list[tuple[str, Any]]:
    catalog = yaml.safe_load((ROOT / "controlplane" / "catalog.yaml").read_text())
    return [*((f"k8s {target}", render(target)) for target in TARGETS), ("controlplane/catalog.yaml", catalog)]


@pytest.mark.parametrize(("where", "docs"), shipped(), ids=[w for w, _ in shipped()])
def test_shipped_manifests_set_the_gateway_only_by_current_names(where: str, docs: Any) -> None:
    current = {Settings.env_name(f.name) for f in dataclasses.fields(Settings)}
    names = {found for text in _strings(docs) for found in ENV.findall(text)}
    assert names <= current | OTHER_COMMANDS, f"{where}: not a setting: {sorted(names - current - OTHER_COMMANDS)}"
    parser = argparse.ArgumentParser(exit_on_error=False)
    Settings.add_arguments(parser)
    for args in _serve_args(docs):
        parsed = parser.parse_args(args[1:])
        assert Settings.deprecations(parsed, {}) == [], f"{where}: {args}"
        Settings.resolve(parsed, {})


def test_the_gateway_config_map_resolves_without_a_deprecation() -> None:
    (config,) = [d for d in render("cpu") if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "sr-gateway"]
    data = {k: str(v) for k, v in config["data"].items()}
    assert "SR_GATEWAY_SHUTDOWN_S" in data and Settings.deprecations(None, data) == []
    assert Settings.resolve(None, data).shutdown_s == float(data["SR_GATEWAY_SHUTDOWN_S"])
