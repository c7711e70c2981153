"""A Triton model config's text form (config.pbtxt), read by protobuf's text_format into Triton's own `ModelConfig`
message, and edited one top-level field at a time in place.

Why edit in place rather than print the message again: protobuf's printer drops every comment and rewrites the
layout, and a generated copy of an author's config (configs/tuned.pbtxt) must read like the author's file with only
the tuned fields changed. So the text is split into its top-level fields by protobuf's own tokenizer (which knows
strings, comments and nesting), each field keeps the lines it spans, and an edit replaces only the lines of the
field it changes (keeping their indentation and a trailing comment); everything else stays byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from google.protobuf import text_encoding, text_format
from tritonclient.grpc import model_config_pb2

_OPEN, _CLOSE = ("{", "[", "<"), ("}", "]", ">")
# the house layout of the two fields the tuner and the GPU build write (config.pbtxt uses the same)
_GROUP_FIELDS = {"kind", "count"}


class ConfigError(RuntimeError):
    """A config.pbtxt that is not a Triton model config, or one an edit cannot be applied to."""


def parse(text: str) -> model_config_pb2.ModelConfig:
    """The config as Triton reads it; a syntax error or an unknown field names its line and column."""
    config = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"not a Triton model config: {exc}") from exc
    return config


def string_parameters(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    """The config's `parameters` as strings (Triton's parameters carry only `string_value`)."""
    return {str(key): str(value.string_value) for key, value in config.parameters.items()}


def text_parameters(text: str) -> dict[str, str]:
    """A config.pbtxt's string parameters, read from its text."""
    return string_parameters(parse(text))


@dataclass(frozen=True)
class Field:
    """One top-level field of a config's text: its name and the lines it spans (0-based, `last` included);
    `shared`: another field starts or ends on one of its lines, so its lines cannot be replaced alone."""

    name: str
    first: int
    last: int
    shared: bool = False


def fields(text: str) -> list[Field]:
    """The top-level fields of a config's text, in order. Protobuf's tokenizer pulls lines from the iterator only
    as it needs them, so the line last pulled is the one holding the current token."""
    lines = _lines(text)
    pulled = 0

    def feed() -> Iterator[str]:
        nonlocal pulled
        for line in lines:
            pulled += 1
            yield line

    tokens = text_format.Tokenizer(feed())
    spans: list[tuple[str, int, int]] = []
    try:
        while not tokens.AtEnd():
            first = pulled - 1
            name = tokens.ConsumeIdentifier()
            tokens.TryConsume(":")
            last = _skip_value(tokens, lambda: pulled - 1)
            if tokens.token in (";", ","):  # an optional separator belongs to the field before it
                last = pulled - 1
                tokens.NextToken()
            spans.append((name, first, last))
    except text_format.ParseError as exc:
        raise ConfigError(f"not a Triton model config: {exc}") from exc
    out = []
    for i, (name, first, last) in enumerate(spans):
        shared = (i > 0 and spans[i - 1][2] >= first) or (i + 1 < len(spans) and spans[i + 1][1] <= last)
        out.append(Field(name, first, last, shared))
    return out


def _skip_value(tokens: text_format.Tokenizer, line: Callable[[], int]) -> int:
    """Move past one field's value (a scalar, adjacent strings, or a bracketed message or list); the line of its
    last token."""
    if tokens.token not in _OPEN:
        at = line()
        is_string = tokens.token[:1] in ("'", '"')
        tokens.NextToken()
        while is_string and tokens.token[:1] in ("'", '"'):  # "a" "b" is one string in text format
            at = line()
            tokens.NextToken()
        return at
    depth = 0
    while True:
        if tokens.AtEnd():
            raise ConfigError("not a Triton model config: a bracket is never closed")
        depth += (tokens.token in _OPEN) - (tokens.token in _CLOSE)
        at = line()
        tokens.NextToken()
        if depth == 0:
            return at


def _lines(text: str) -> list[str]:
    """The text's lines, ends kept, split at newlines only: str.splitlines also splits at the other line breaks
    Unicode knows (U+0085, U+2028, ...), which text format allows unescaped inside a string."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _quoted(value: str) -> str:
    return '"' + text_encoding.CEscape(value, as_utf8=True) + '"'


def _trailing_comment(line: str) -> str:
    """The comment that ends a line (`# …`), else ''."""
    tokens = text_format.Tokenizer([line], skip_comments=False)
    last = ""
    while not tokens.AtEnd():
        last = tokens.token
        tokens.NextToken()
    return last.strip() if last.lstrip().startswith("#") else ""


class ConfigText:
    """A config.pbtxt's text with its parsed message; `set_parameter` and `set_instances` change one field each
    and `text` is the result (every other line as it was)."""

    def __init__(self, text: str) -> None:
        self.config = parse(text)
        self._lines = _lines(text)
        self._fields = fields(text)

    @property
    def text(self) -> str:
        return "".join(self._lines)

    def _field_text(self, field: Field) -> str:
        return "".join(self._lines[field.first:field.last + 1])

    def _alone(self, field: Field, what: str) -> model_config_pb2.ModelConfig:
        if field.shared:
            raise ConfigError(f"{what} shares a line with another field (line {field.first + 1}): put it on its own")
        return parse(self._field_text(field))

    def _replace(self, field: Field, line: str) -> None:
        """Replace the field's lines by one line, with the first line's indentation and the last one's comment."""
        first = self._lines[field.first]
        indent = first[: len(first) - len(first.lstrip())]
        comment = _trailing_comment(self._lines[field.last])
        self._lines[field.first:field.last + 1] = [indent + line + (f"  {comment}" if comment else "") + "\n"]
        self._refresh()

    def _append(self, line: str) -> None:
        if self._lines and not self._lines[-1].endswith("\n"):
            self._lines[-1] += "\n"
        self._lines.append(line + "\n")
        self._refresh()

    def _refresh(self) -> None:
        text = self.text
        self.config = parse(text)
        self._fields = fields(text)

    def set_parameter(self, key: str, value: str) -> None:
        """`parameters: { key: KEY, value: { string_value: VALUE } }` in place of each field that sets KEY, else
        appended at the end."""
        line = f"parameters: {{ key: {_quoted(key)}, value: {{ string_value: {_quoted(value)} }} }}"
        setting = [f for f in self._fields if f.name == "parameters" and not f.shared
                   and key in parse(self._field_text(f)).parameters]
        if not setting and key in self.config.parameters:  # set only by a field that shares a line with another
            raise ConfigError(f"parameter {key!r} is set on a line shared with another field: put it on its own")
        for field in reversed(setting):  # bottom up: the lines of the fields above keep their numbers
            others = sorted(set(parse(self._field_text(field)).parameters) - {key})
            if others:
                raise ConfigError(f"parameter {key!r} shares its field with {others} (line {field.first + 1}): "
                                  f"give it a `parameters:` field of its own")
            self._replace(field, line)
        if not setting:
            self._append(line)
        if self.config.parameters[key].string_value != value:  # also set by a field sharing a line with another
            raise ConfigError(f"parameter {key!r} is set on a line shared with another field: put it on its own")

    def set_instances(self, count: int, kind: str | None = None) -> None:
        """The count (and, given, the kind: KIND_CPU, KIND_GPU) of the config's one instance group; a config with
        none, several, or one of another `kind` than required is an error, never silently widened."""
        groups = [f for f in self._fields if f.name == "instance_group"]
        if len(groups) != 1 or len(self.config.instance_group) != 1:
            raise ConfigError(f"expected one instance group, found {len(self.config.instance_group)}")
        group = self._alone(groups[0], "instance_group").instance_group[0]
        group.count = count
        if kind is not None:
            group.kind = model_config_pb2.ModelInstanceGroup.Kind.Value(kind)
        self._replace(groups[0], f"instance_group [ {{ {_group_text(group)} }} ]")


def _group_text(group: model_config_pb2.ModelInstanceGroup) -> str:
    """`kind: KIND_CPU, count: 2` as config.pbtxt writes it; a group with more fields in protobuf's one-line form."""
    if {f.name for f, _ in group.ListFields()} <= _GROUP_FIELDS:
        return f"kind: {model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind)}, count: {group.count}"
    return text_format.MessageToString(group, as_one_line=True)
