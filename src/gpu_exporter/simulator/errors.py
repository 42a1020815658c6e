"""Errors raised by the simulator."""

from __future__ import annotations


class ScenarioError(ValueError):
    """An invalid scenario or event; the message is one line: ``<file>: <key.path>: <reason>``."""

    def __init__(self, source: str, path: str, reason: str) -> None:
        self.source = source
        self.path = path or "(root)"
        self.reason = reason
        super().__init__(f"{source}: {self.path}: {reason}")


class Invalid(Exception):
    """Raised by validators with the key path; turned into a ScenarioError with the file name."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def at(self, source: str) -> ScenarioError:
        return ScenarioError(source, self.path, self.reason)


class NvmlFailure(Exception):
    """Raised inside a fake NVML function to return a non-zero ``nvmlReturn_t``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code
