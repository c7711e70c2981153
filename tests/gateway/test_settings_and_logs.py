"""The settings mechanism and the JSON log format both services share (sr_common.settings, sr_common.logs): flag >
env twin > default, every invalid value a SettingsError naming the setting and its env twin (the gateway's checks at
their edges), and the same JSON keys from the gateway and the control plane."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from controlplane.config import Settings as ControlPlaneSettings
from controlplane.telemetry import REQUEST_ID, configure_logging
from gateway.cli import start_settings
from gateway.logs import configure
from gateway.settings import Settings
from sr_common.settings import SettingsBase, SettingsError

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@dataclass(frozen=True)
class Example(SettingsBase):
    ENV_PREFIX: ClassVar[str] = "SR_EXAMPLE_"

    workers: int = field(default=2, metadata={"help": "workers"})
    wait_seconds: float = field(default=1.5, metadata={"help": "wait"})
    root: Path = field(default=Path("/srv"), metadata={"help": "root"})
    name: str = field(default="x", metadata={"help": "name"})

    def validate(self) -> None:
        if self.workers < 1:
            raise self.error("workers", "must be at least 1")


def parse(cls: type[SettingsBase], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cls.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_setting_is_its_flag_else_its_env_twin_else_its_default_as_the_defaults_type() -> None:
    env = {"SR_EXAMPLE_WORKERS": "3", "SR_EXAMPLE_ROOT": "/data", "SR_EXAMPLE_WAIT_SECONDS": "0.25"}
    got = Example.resolve(parse(Example, ["--workers", "4"]), env)
    assert got == Example(workers=4, wait_seconds=0.25, root=Path("/data"), name="x")
    assert Example.resolve(None, {}) == Example()
    assert Example.env_name("wait_seconds") == "SR_EXAMPLE_WAIT_SECONDS"


def test_every_flags_help_names_its_env_twin_and_default() -> None:
    parser = argparse.ArgumentParser()
    Example.add_arguments(parser)
    helps = {a.dest: a.help for a in parser._actions if a.dest != "help"}
    assert helps["wait_seconds"] == "wait (env SR_EXAMPLE_WAIT_SECONDS, default 1.5)"
    assert set(helps) == {"workers", "wait_seconds", "root", "name"}


@pytest.mark.parametrize(("cls", "env", "message"), [
    (Example, {"SR_EXAMPLE_WORKERS": "two"}, "workers (SR_EXAMPLE_WORKERS): 'two' is not a valid int"),
    (Example, {"SR_EXAMPLE_WORKERS": "0"}, "workers (SR_EXAMPLE_WORKERS): must be at least 1"),
    (Settings, {"SR_GATEWAY_SHUTDOWN_S": "soon"},
     "shutdown_s (SR_GATEWAY_SHUTDOWN_S): 'soon' is not a valid float"),
    (ControlPlaneSettings, {"SR_CP_KUBE_TIMEOUT_S": "soon"},
     "kube_timeout_s (SR_CP_KUBE_TIMEOUT_S): 'soon' is not valid"),
    (ControlPlaneSettings, {"SR_CP_MAX_REPLICAS": "0"}, "max_replicas (SR_CP_MAX_REPLICAS): must be at least 1"),
])
def test_an_invalid_value_is_one_error_type_in_both_services_naming_the_setting_and_its_env_twin(
        cls: type[SettingsBase], env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        cls.resolve(None, env)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(("name", "refused", "accepted"), [
    ("max_request_bytes", "0", "1"),
    ("model_retry_s", "-0.001", "0.0"),
    ("liveness_failed_s", "-1", "0.0"),
    ("triton_restart_backoff_s", "-0.5", "0.0"),
    ("triton_check_s", "0", "0.001"),
    ("result_cache", "some", "off"),
    ("systemone_schema", "vllm-sr/3.0", "vllm-sr/4.0"),
    ("log_format", "xml", "json"),
])
def test_each_gateway_check_refuses_the_value_past_its_edge_and_accepts_the_edge(name: str, refused: str,
                                                                                   accepted: str) -> None:
    env_name = Settings.env_name(name)
    with pytest.raises(SettingsError, match=rf"^{name} \({env_name}\): "):
        Settings.resolve(None, {env_name: refused})
    assert str(getattr(Settings.resolve(None, {env_name: accepted}), name)) == accepted


def test_a_renamed_duration_still_takes_its_former_flag_and_env_name_and_says_which_name_replaces_it() -> None:
    by_env = {"SR_GATEWAY_SHUTDOWN_SECONDS": "7", "SR_GATEWAY_TRITON_CHECK_SECONDS": "0.5"}
    assert (Settings.resolve(None, by_env).shutdown_s, Settings.resolve(None, by_env).triton_check_s) == (7.0, 0.5)
    assert Settings.deprecations(None, by_env) == [
        f"SR_GATEWAY_{old}_SECONDS is deprecated and will be removed in the next release; use SR_GATEWAY_{old}_S"
        for old in ("SHUTDOWN", "TRITON_CHECK")]
    args = parse(Settings, ["--liveness-failed-seconds", "12"])
    assert Settings.resolve(args, {}).liveness_failed_s == 12.0
    assert Settings.deprecations(args, {}) == [
        "--liveness-failed-seconds is deprecated and will be removed in the next release; use --liveness-failed-s"]


def test_a_new_name_wins_over_its_former_one_and_a_start_with_new_names_warns_of_nothing() -> None:
    both = {"SR_GATEWAY_SHUTDOWN_S": "3", "SR_GATEWAY_SHUTDOWN_SECONDS": "9"}
    assert Settings.resolve(parse(Settings, ["--shutdown-s", "1", "--shutdown-seconds", "2"]), both).shutdown_s == 1
    assert Settings.resolve(None, both).shutdown_s == 3.0
    assert Settings.deprecations(None, both) == []
    assert Settings.deprecations(parse(Settings, ["--model-retry-s", "4"]), {}) == []


def test_a_former_name_is_checked_like_the_new_one_and_the_error_names_the_new_one() -> None:
    with pytest.raises(SettingsError, match=r"^triton_check_s \(SR_GATEWAY_TRITON_CHECK_S\): must be positive"):
        Settings.resolve(None, {"SR_GATEWAY_TRITON_CHECK_SECONDS": "0"})


def test_every_gateway_duration_ends_in_s_as_the_control_planes_do() -> None:
    durations = [f.name for f in dataclasses.fields(Settings) if isinstance(f.default, float)]
    assert durations and all(name.endswith("_s") for name in durations), durations
    assert all(f.metadata["formerly"] == f.name + "econds" for f in dataclasses.fields(Settings)
               if f.name in durations)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """`configure` replaces the root logger's handlers: put pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_both_services_write_the_same_json_keys(root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure("info", "json")
    logging.getLogger("sr_gateway.request").info("GET /health 200", extra={"status": 200})
    (gateway,) = json_lines(capsys.readouterr().err)
    configure_logging("json", "info")
    token = REQUEST_ID.set("req-7")
    try:
        logging.getLogger("controlplane.audit").info("create d1", extra={"action": "create"})
    finally:
        REQUEST_ID.reset(token)
    logging.getLogger("controlplane").warning("outside a request")
    inside, outside = json_lines(capsys.readouterr().err)
    for line in (gateway, inside, outside):
        assert list(line)[:4] == ["time", "level", "logger", "message"] and TIME.match(line["time"]), line
    assert gateway == {**gateway, "level": "info", "logger": "sr_gateway.request", "status": 200}
    assert inside["request_id"] == "req-7" and inside["action"] == "create"
    assert outside["request_id"] == "-" and outside["level"] == "warning"


def test_an_exception_is_part_of_its_json_line_and_text_logs_keep_the_request_id(
        root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure("info", "json")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("sr_gateway").exception("failed")
    (line,) = json_lines(capsys.readouterr().err)
    assert line["message"] == "failed" and "RuntimeError: boom" in line["exception"]
    configure_logging("text", "info")
    token = REQUEST_ID.set("req-9")
    try:
        logging.getLogger("controlplane").info("hello")
    finally:
        REQUEST_ID.reset(token)
    assert re.search(r" INFO controlplane \[req-9\] hello$", capsys.readouterr().err.strip())


def test_serve_logs_one_warning_per_former_name_it_was_started_with_in_the_logs_own_format(
        root_logging: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SR_GATEWAY_LOG_FORMAT", "json")
    monkeypatch.setenv("SR_GATEWAY_MODEL_RETRY_SECONDS", "5")
    settings = start_settings(parse(Settings, ["--shutdown-seconds", "2"]))
    assert settings is not None and (settings.shutdown_s, settings.model_retry_s) == (2.0, 5.0)
    lines = json_lines(capsys.readouterr().err)
    assert [(line["level"], line["message"]) for line in lines] == [
        ("warning", "--shutdown-seconds is deprecated and will be removed in the next release; use --shutdown-s"),
        ("warning", "SR_GATEWAY_MODEL_RETRY_SECONDS is deprecated and will be removed in the next release; "
                    "use SR_GATEWAY_MODEL_RETRY_S")]
