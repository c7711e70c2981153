"""The settings mechanism both services share (`sr-gateway serve`, `sr-controlplane serve`): one frozen dataclass
per service whose every field is a CLI flag with an env twin (PREFIX + the field's name in capitals), resolved
flag > environment > default, converted to the field's type and checked at start, so a typo in a manifest stops
the start with the setting's name instead of running on a default.

A service subclasses `SettingsBase` with its fields, its `ENV_PREFIX`, and its own checks in `validate()`; a field
whose value is not a plain str/int/float/Path conversion overrides `convert()`.

A renamed setting keeps its old name for one release: `metadata={"formerly": "old_name"}` accepts the old flag and
env twin when the new ones are absent, and `deprecations()` says which old names a start used, so the service logs
a warning naming the new one (after its logging is configured) instead of breaking a manifest on upgrade.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self


class SettingsError(ValueError):
    """A setting has an invalid value; the message starts with the setting's name and its env twin."""


@dataclass(frozen=True)
class SettingsBase:
    ENV_PREFIX: ClassVar[str] = ""

    @classmethod
    def env_name(cls, name: str) -> str:
        """The env twin of a setting."""
        return cls.ENV_PREFIX + name.upper()

    @classmethod
    def error(cls, name: str, message: str) -> SettingsError:
        """The error for one setting, named as an operator sets it (field and env twin)."""
        return SettingsError(f"{name} ({cls.env_name(name)}): {message}")

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """One flag per setting (`--the-name`); its help names the env twin and the default."""
        for f in dataclasses.fields(cls):
            default = "" if f.default is dataclasses.MISSING else f", default {f.default}"
            flag = "--" + f.name.replace("_", "-")
            parser.add_argument(flag, dest=f.name, default=None, metavar=f.name.upper(),
                                help=f"{f.metadata['help']} (env {cls.env_name(f.name)}{default})")
            old = f.metadata.get("formerly")
            if old:
                parser.add_argument("--" + old.replace("_", "-"), dest=_old_dest(old), default=None,
                                    metavar=f.name.upper(), help=f"deprecated: use {flag}")

    @classmethod
    def _raw(cls, f: dataclasses.Field[Any], args: argparse.Namespace | None,
             env: Mapping[str, str]) -> tuple[str | None, str | None]:
        """The raw value of a setting and, when it came from a deprecated name, that name (flag or env)."""
        if args is not None and getattr(args, f.name, None) is not None:
            return getattr(args, f.name), None
        old = f.metadata.get("formerly")
        if old and args is not None and getattr(args, _old_dest(old), None) is not None:
            return getattr(args, _old_dest(old)), "--" + old.replace("_", "-")
        if cls.env_name(f.name) in env:
            return env[cls.env_name(f.name)], None
        if old and cls.env_name(old) in env:
            return env[cls.env_name(old)], cls.env_name(old)
        return None, None

    @classmethod
    def deprecations(cls, args: argparse.Namespace | None = None,
                     environ: Mapping[str, str] | None = None) -> list[str]:
        """One warning per deprecated flag or env name that `resolve` took a value from, naming its replacement."""
        env = os.environ if environ is None else environ
        out = []
        for f in dataclasses.fields(cls):
            _, old = cls._raw(f, args, env)
            if old is not None:
                new = "--" + f.name.replace("_", "-") if old.startswith("--") else cls.env_name(f.name)
                out.append(f"{old} is deprecated and will be removed in the next release; use {new}")
        return out

    @classmethod
    def resolve(cls, args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None) -> Self:
        """Flag, else env twin, else default; converted to the field's type and checked (SettingsError)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw, _ = cls._raw(f, args, env)
            if raw is not None:
                values[f.name] = cls.convert(f, raw)
        settings = cls(**values)
        settings.validate()
        return settings

    @classmethod
    def convert(cls, f: dataclasses.Field[Any], raw: str) -> Any:
        """A raw flag/env string as the type of the field's default (str, int, float, Path)."""
        kind: Any = type(f.default)
        try:
            return kind(raw)
        except ValueError as exc:
            raise cls.error(f.name, f"{raw!r} is not a valid {kind.__name__}") from exc

    def validate(self) -> None:
        """Reject values no deployment could want (SettingsError naming the setting); none by default."""


def _old_dest(old: str) -> str:
    """The argparse destination of a deprecated flag (apart from the fields, so `resolve` knows which was used)."""
    return "formerly_" + old
