"""YAML values that remember where they came from, so spec errors can say
`file:line: slos[1].objective: must be between 0 and 1`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import yaml

from slo.spec import SpecError

_MISSING = object()


def _spec_error(message: str) -> SpecError:
    return SpecError(message)


class Located:
    """One YAML node (or an absent one) with its path, line and source."""

    def __init__(self, loader, node, path: str, source: str, line: int, default=_MISSING):
        self._loader, self.node, self.path, self.source = loader, node, path, source
        self.line = node.start_mark.line + 1 if node is not None else line
        self._default = default

    @property
    def present(self) -> bool:
        return self.node is not None

    @property
    def value(self):
        if self.node is None:
            return None if self._default is _MISSING else self._default
        return self._loader.construct_object(self.node, deep=True)

    def error(self, message: str):
        return _spec_error(f"{self.source}:{self.line}: {self.path or '<root>'}: {message}")

    def child(self, node, path: str) -> "Located":
        return Located(self._loader, node, path, self.source, self.line)

    def mapping(self, what: str) -> "LocatedMapping":
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"{what} must be a mapping")
        return LocatedMapping(self._loader, self.node, self.path, self.source, self.line)

    def sequence(self) -> "LocatedSequence":
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error("must be a list")
        return LocatedSequence(self._loader, self.node, self.path, self.source, self.line)

    def string(self) -> str:
        value = self.value
        if not isinstance(value, str):
            raise self.error(f"must be a string, not {value!r}")
        return value

    def number(self) -> float:
        value = self.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"must be a number, not {value!r}")
        return value

    def choice(self, options: Iterable[str]) -> str:
        value, options = self.value, tuple(options)
        if value not in options:
            raise self.error(f"must be one of {', '.join(options)}, not {value!r}")
        return value

    def convert(self, fn: Callable):
        try:
            return fn(self.value)
        except (ValueError, TypeError) as exc:
            raise self.error(str(exc)) from None


class LocatedMapping(Located):
    def _pairs(self):
        return [(self._loader.construct_object(k), v) for k, v in self.node.value]

    def _path(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def get(self, key: str, default=_MISSING) -> Located:
        for name, node in self._pairs():
            if name == key:
                return self.child(node, self._path(key))
        return Located(self._loader, None, self._path(key), self.source, self.line, default)

    def require(self, key: str) -> Located:
        found = self.get(key)
        if not found.present:
            raise self.error(f"missing required field '{key}'")
        return found

    def only(self, allowed: set[str]) -> None:
        for name, node in self._pairs():
            if name not in allowed:
                raise self.child(node, self._path(str(name))).error(
                    f"unknown field (allowed: {', '.join(sorted(allowed))})")


class LocatedSequence(Located):
    def items(self) -> list[Located]:
        return [self.child(node, f"{self.path}[{i}]") for i, node in enumerate(self.node.value)]


def load_located(text: str, source: str) -> Located:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    finally:
        loader.dispose()
    if node is None:
        raise _spec_error(f"{source}:1: the spec is empty")
    return Located(loader, node, "", source, 1)
