"""Every error a user or an operator can cause, in one hierarchy under ``RecsError``.

The CLI prints ``str(error)`` as one line and exits with ``exit_code`` (2 unless a class says
otherwise); the read API answers with ``http_status`` where a class has one. Classes are grouped
by the component that raises them. (The traversal's own ``ShardMismatchError`` and
``StaleGraphError`` are defined in ``recs.traversal``, also under ``RecsError``.)
"""

from __future__ import annotations


class RecsError(Exception):
    """Base class of every error a user or an operator can cause and fix."""

    exit_code = 2


# --- arguments and runs (recs.nightly.runs, recs.published, recs.cli) ------------------------


class UnknownUserError(RecsError):
    """A user id that is not in the live store or the published version."""

    http_status = 404


class RunNotFoundError(RecsError):
    """No run, snapshot or published version where one was expected."""


class CorruptFileError(RunNotFoundError):
    """A state file exists but is not what it must be: truncated, not JSON, or not a JSON object
    (an interrupted writer that did not write atomically, a disk fault, an edit by hand). A
    ``RunNotFoundError``, so whatever skips a missing run or version skips a damaged one too.
    ``path``: the file, where the raiser names one (``recs.nightly.runs.naming_the_stage``
    adds the stage that writes it)."""

    def __init__(self, message: str, path: object = None) -> None:
        super().__init__(message)
        self.path = path


class ShardOutOfRangeError(RecsError):
    """A shard id outside ``0 .. shard_count - 1``."""


class InvalidDateError(RecsError):
    """A snapshot date that is not an ISO ``YYYY-MM-DD`` calendar date."""


class InvalidRunIdError(RecsError):
    """A run id outside ``recs.nightly.runs.RUN_ID_PATTERN`` (the message names the rule)."""


class SchemaMismatchError(RecsError):
    """A frame or file does not have the columns and dtypes of its contract (``recs.contracts``)."""


class DatasetError(RecsError):
    """An unknown dataset name, a missing or malformed file, bad generator arguments, or a
    non-empty live store to load into without ``--replace`` (``recs.demo``, ``recs.store.bulk``)."""


class EvaluationError(RecsError):
    """An evaluation that cannot be run as asked (``recs evaluate``: unknown variant or
    baseline, no test user, a temporal split of edges without times)."""


# --- the live store (recs.store) -------------------------------------------------------------


class StoreUnavailableError(RecsError):
    """The live store could not be reached (or answered with an error) for a check that must
    not fail open: dismissals, blocks and mutes, the user's own account, writes."""

    http_status = 503


class LiveStoreError(RecsError):
    """The live store is missing, has no schema, or cannot be read consistently (a snapshot)."""


# --- event ingestion (recs.ingest) -----------------------------------------------------------


class IngestInputError(RecsError):
    """A path to ingest that does not exist or is not an event file."""


class CountsDriftError(RecsError):
    """``recs reconcile`` found follower/following counts that differ from the edges."""

    exit_code = 1


# --- bulk import (recs.imports) --------------------------------------------------------------


class ImportInputError(RecsError):
    """An input ``recs import`` cannot read as asked: a missing file or column, a bad option, a
    failing ``--query``, or a column none of whose values parse (a wrong ``--time-format``)."""


# --- the nightly run (recs.nightly) ----------------------------------------------------------


class RunInProgressError(RecsError):
    """Another process holds the run (or the shard) this command would write
    (``recs.nightly.locks``). Nothing was written; try again once it has finished."""

    exit_code = 75  # EX_TEMPFAIL (sysexits.h): a temporary condition, retry later


class SnapshotNotRetainedError(RecsError):
    """A run for a past date whose snapshot is not retained, and the live store has moved past
    that date's cut-off: rebuilding it needs an explicit ``--rebuild-snapshot``."""


class RunIdTakenError(RecsError):
    """The run id names a published version of another snapshot date: a version is stored by
    run id alone, so publishing would replace it (and a rollback to it would serve the other
    date's lists). Nothing was written; give the run another run id."""


class CutOffAheadError(RecsError):
    """A run whose cut-off (the end of its data interval) is still ahead of the wall clock: its
    day is not over, and a snapshot frozen now would be retained as that day's, then reused by
    the day's own run with the rest of the day missing. ``seconds_ahead``: by how much."""

    def __init__(self, message: str, seconds_ahead: float = 0.0) -> None:
        super().__init__(message)
        self.seconds_ahead = seconds_ahead


class ShardPlanError(RecsError):
    """The shard plan does not fit the deployment (more shards than Airflow's
    ``max_map_length``) or the plan settings contradict each other."""


class ModelsBuildError(RecsError):
    """``dbt build`` failed (a model or a data test), or an export is missing."""


class ValidationFailedError(RecsError):
    """The data failed the Great Expectations gate: the run must not be published."""

    exit_code = 3


class ValidationEngineError(RecsError):
    """The gate itself could not judge the run: Great Expectations (or the gate's own code)
    raised, or an expectation's metric could not be computed. Not a verdict on the data; the
    results are saved and the run is not published."""

    exit_code = 4


class NothingToValidateError(RecsError):
    """There is nothing to validate: no shard produced output, nobody is eligible tonight, or
    a stage before the traversal did not complete. The run is not published."""

    exit_code = 5


class CarryOverError(RecsError):
    """Shards failed and there is no published version to carry their users' lists over from
    (nothing is ``CURRENT``, or it is incomplete)."""

    exit_code = 6


# --- the online read path (recs.serving, recs.api, recs.auth) --------------------------------
# ``http_status`` is the status the API answers with; the CLI still prints one line.


class InvalidRequestError(RecsError):
    """A malformed user id, candidate id, limit or request body."""

    http_status = 400


class AuthenticationError(RecsError):
    """No bearer token, or one that is malformed, badly signed or expired."""

    http_status = 401


class PermissionDeniedError(RecsError):
    """A valid token that may not act on the requested user."""

    http_status = 403


class DismissalNotFoundError(RecsError):
    """``DELETE`` of a dismissal that does not exist."""

    http_status = 404


class SwitchError(RecsError):
    """``CURRENT`` could not be switched (a full disk, an I/O error: ``recs.nightly.publish``);
    the message says which version it names now, since the write may have failed after its
    rename (the folder's fsync): then the switch happened, and a plain rollback run again would
    go one version further back."""

    exit_code = 74  # EX_IOERR (sysexits.h)


class RunStoreError(RecsError):
    """The run store (``RECS_RUN_STORE_URL``, ``recs.nightly.artifacts``) cannot be used: a
    malformed URL, a protocol without its fsspec package, or storage that cannot be reached or
    refuses a read or write."""


class ArtifactNotFoundError(RunNotFoundError):
    """A run artifact a stage reads is not complete in the run store: the stage that writes it
    has not succeeded there (its marker is missing), or a file changed while it was read."""


class ConfigurationError(RecsError):
    """A setting the command needs is missing or unusable (e.g. ``RECS_API_JWT_SECRET``)."""


def quoted(value: object, limit: int = 64, *, render=repr) -> str:
    """``render(value)`` (``repr``, or e.g. a JSON spelling) for a message, cut to ``limit``
    characters with the full length said, so an oversized input (a 5,000-digit query
    parameter) is not echoed back whole."""
    text = render(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(str(value)):,} characters)"
