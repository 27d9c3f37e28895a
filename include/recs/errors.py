"""Exceptions a user can cause. The CLI prints ``str(error)`` as one line and exits non-zero."""

from __future__ import annotations


class RecsError(Exception):
    """Base class of every error a user or an operator can cause and fix."""

    exit_code = 2


class UnknownUserError(RecsError):
    """A user id that is not in the live store or the published version."""


class RunNotFoundError(RecsError):
    """No run, snapshot or published version where one was expected."""


class ShardOutOfRangeError(RecsError):
    """A shard id outside ``0 .. shard_count - 1``."""


class InvalidDateError(RecsError):
    """A snapshot date that is not an ISO ``YYYY-MM-DD`` calendar date."""


class DatasetError(RecsError):
    """An unknown dataset name, a missing file or a file that does not parse."""


class ValidationFailedError(RecsError):
    """The Great Expectations gate failed: the run must not be published."""

    exit_code = 3
