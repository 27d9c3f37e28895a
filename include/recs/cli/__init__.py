"""The ``recs`` command line (Typer): one module per command group.

``data`` (load-dataset, generate-graph), ``imports`` (import edges, users, blocks, mutes,
dismissals, interests), ``ingest`` (ingest, reconcile), ``nightly`` (run, shard run, validate,
publish, summary, runs, runs show, rollback, gc), ``read`` (recommend, serve, token),
``report`` (report, dbt-docs) and ``evaluate`` (evaluate) register their commands on the one
``app`` (``recs.cli.app``).
Every command calls the same function the Airflow task or the API calls. Any error a user can
cause exits non-zero with one line ``recs: error: …`` on stderr, never a traceback (``main``).
"""

from __future__ import annotations

import logging
import signal
import sys
import time

import typer
from pydantic import ValidationError

from recs.cli import data, evaluate, imports, ingest, nightly, read, report  # noqa: F401 - each registers its commands
from recs.cli.app import app, argument_hint
from recs.errors import RecsError

ABORTED = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""
IO_ERROR = 74
"""The exit code of an ``OSError`` no command turned into one of its own (EX_IOERR, sysexits.h)."""
TERMINATED = 143
"""The exit code of a command stopped by SIGTERM (128 + SIGTERM: what a shell reports for a
process the signal killed), after its clean-up ran (``entry``)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C is (``entry``): the command stops the same
    way, its ``finally`` blocks and context managers run (a transaction rolled back, a
    throwaway folder removed), and it exits ``TERMINATED``."""


_signalled: list[float | None] = []
"""Each SIGTERM this process received: when it raised (``time.monotonic``), None if ignored
(Typer turns the interrupt into a returned 130, so the exception's type does not reach
``main``)."""

TERM_GRACE_SECONDS = 30.0
"""How long after a SIGTERM a further one is ignored: the first one's clean-up runs meanwhile
(Kubernetes' default termination grace period; a supervisor kills with SIGKILL after it)."""


def _raise_terminated(signum: int, frame: object) -> None:
    """Raise ``Terminated``, except within ``TERM_GRACE_SECONDS`` of the last one raised: a
    second SIGTERM (a supervisor repeating its stop, a second ``kill``) arrives while the
    first's clean-up runs and would cut it short, so it is recorded and ignored. After the
    grace one raises again, in case the first was swallowed (an exception in a ``__del__`` is
    only printed: a review). SIGKILL still ends the process at once."""
    now = time.monotonic()
    raised = [at for at in _signalled if at is not None]
    _signalled.append(None if raised and now - raised[-1] < TERM_GRACE_SECONDS else now)
    if _signalled[-1] is not None:
        raise Terminated


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning every user-causable error into one line on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        # Outside standalone mode Typer returns an exit code instead of raising it, and Ctrl-C
        # (KeyboardInterrupt) becomes a returned 130: kept, never dropped for a 0
        code = app(args=argv, standalone_mode=False)
    except typer.Exit as done:
        code = done.exit_code
    except (typer.Abort, KeyboardInterrupt):
        code = ABORTED
    except typer.TyperException as error:
        if type(error).__name__ == "NoArgsIsHelpError":  # bare `recs` or `recs shard`
            sys.stderr.write(error.format_message().rstrip() + "\n")
            return 2
        message, option = " ".join(error.format_message().split()), _taken_as_argument(error, argv)
        if option is not None:
            message = f"No such option: {option}"
        line = " ".join(f"{message}{_misplaced_option(error, argv, option)}".split())
        sys.stderr.write(f"recs: error: {line}\n")  # one line, whatever the words held
        return error.exit_code
    except RecsError as error:
        if not _interrupted(error):
            sys.stderr.write(f"recs: error: {error}\n")
            return error.exit_code
        code = ABORTED  # a store error that was Ctrl-C (_interrupted): not the store's fault
    except ValidationError as error:
        from recs.config import Settings

        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "settings"
        if first.get("loc") and first["loc"][0] in Settings.model_fields:  # what the user set
            where = f"RECS_{str(first['loc'][0]).upper()}" + where[len(str(first["loc"][0])) :]
        reason = str(first.get("msg")).removeprefix("Value error, ")  # pydantic's, for ours
        sys.stderr.write(f"recs: error: invalid setting {where}: {reason}\n")
        return 2
    except OSError as error:  # the machine's, not ours: a full disk, an I/O error, a permission
        if not _interrupted(error):
            sys.stderr.write(f"recs: error: {error}\n")
            return IO_ERROR
        code = ABORTED
    except Exception as error:
        if not _interrupted(error):
            raise  # a defect: its traceback is the report
        code = ABORTED
    if code == ABORTED:
        terminated = bool(_signalled)
        sys.stderr.write("recs: terminated\n" if terminated else "recs: aborted\n")
        return TERMINATED if terminated else ABORTED
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _taken_as_argument(error: Exception, argv: list[str] | None) -> str | None:
    """The unknown option a command taking a user id (``ID_ARGUMENT``: it reads ``-1`` as its
    argument) read as its argument, when that left a word over: ``recs recommend --user-id 7``
    said "Got unexpected extra argument(s) (7)" alone; None otherwise."""
    context = getattr(error, "ctx", None)
    message = getattr(error, "message", "")
    if (
        context is None
        or not getattr(context, "ignore_unknown_options", False)
        or not message.startswith("Got unexpected extra argument")
    ):
        return None
    known = {o: p for p in context.command.params for o in (*p.opts, *p.secondary_opts)}
    words = list(sys.argv[1:] if argv is None else argv)
    value_next = False
    for word in words[: words.index("--") if "--" in words else len(words)]:
        name = word.split("=", 1)[0]
        if value_next:  # a known option's value, whatever it looks like
            value_next = False
        elif name in known:
            value_next = "=" not in word and not getattr(known[name], "is_flag", False)
        elif name.startswith("-") and len(name) > 1 and not name[1].isdigit():
            return name  # not "-1" or "-1.5": a user id parse_id refuses with its rule
    return None


def _misplaced_option(error: Exception, argv: list[str] | None, option: str | None = None) -> str:
    """A hint for an option given before the command that takes it (``recs --json summary``:
    Click's "No such option: --json" alone left a newcomer guessing): "; it belongs after the
    command: recs summary --json" (with its value, for an option that takes one) when the
    command named next in ``argv`` (``sys.argv`` when None) has that option and was not given
    it, or, with no command named after it (``recs shard --snapshot-date D``), when exactly one
    command of the group has it; else, for an option named as a command's argument, how to give
    it (``_argument_instead``); "" otherwise (and after ``--``, where nothing is an option).
    ``option``: the one to place instead of the error's (``_taken_as_argument``)."""
    option, context = option or getattr(error, "option_name", None), getattr(error, "ctx", None)
    if not option or context is None:
        return ""
    words = list(sys.argv[1:] if argv is None else argv)
    at = next((i for i, w in enumerate(words) if w.split("=", 1)[0] == option), None)
    if at is None or "--" in words[:at]:
        return ""
    path, outer = [], context
    while outer is not None and outer.parent is not None:  # `recs shard ...`: the group's path
        path.insert(0, outer.info_name)
        outer = outer.parent
    return _belongs_after(option, context, words, at, path) or _argument_instead(
        option, context, words, at, path
    )


def _belongs_after(option: str, context, words: list[str], at: int, path: list[str]) -> str:
    """``_misplaced_option``'s hint for an option that a command of the group (``context``,
    reached by ``path``) takes: the command named after it in ``words``, or the group's one
    command that has it."""
    group = context.command
    if not hasattr(group, "get_command"):
        return ""

    def taking(name: str):  # the command's parameter of that option, or None
        command = group.get_command(context, name)
        params = getattr(command, "params", [])
        return next((p for p in params if option in p.opts + p.secondary_opts), None)

    def hint(name: str, param, end: int) -> str:
        given = [option]  # a flag alone; `--today=D` as it is; `--today D` with its word
        if not getattr(param, "is_flag", False):
            given = [words[at]] if "=" in words[at] else words[at : min(at + 2, end)]
        return f"; it belongs after the command: {' '.join(['recs', *path, name, *given])}"

    for place, word in enumerate(words[at + 1 :], start=at + 1):
        if group.get_command(context, word) is None:
            continue
        param = taking(word)
        later = [w.split("=", 1)[0] for w in words[place + 1 :]]
        return "" if param is None or option in later else hint(word, param, place)
    having = [name for name in group.list_commands(context) if taking(name) is not None]
    return hint(having[0], taking(having[0]), len(words)) if len(having) == 1 else ""


def _argument_instead(option: str, context, words: list[str], at: int, path: list[str]) -> str:
    """``_misplaced_option``'s hint for an option named as an argument of the command
    (``recs runs show --run-id X``), or of exactly one command of the group (``recs runs --run-id
    X``: a newcomer got Click's line alone): "; RUN_ID is an argument, not an option: recs runs
    show X" (the value given, quoted for a shell, else the argument's name); an argument of one
    value only, named as the option by its name or its metavar; "" otherwise."""
    name = option.lstrip("-").replace("-", "_")
    command = context.command
    if hasattr(command, "get_command"):
        named = [(n, command.get_command(context, n)) for n in command.list_commands(context)]
    else:  # `path` already ends with the command
        named = [(None, command)]

    def shown(param) -> str:  # `[PATH]` of an optional argument: PATH
        return (param.metavar or param.name.upper()).strip("[].")

    found = [
        (n, param)
        for n, cmd in named
        for param in getattr(cmd, "params", [])
        if param.param_type_name == "argument"
        and param.nargs == 1
        and name in (param.name, shown(param).lower())
    ]
    if len(found) != 1:
        return ""
    (command_name, param), word = found[0], words[at]
    given = word.split("=", 1)[1] if "=" in word else next(iter(words[at + 1 : at + 2]), "")
    where = ["recs", *path, *([command_name] if command_name else [])]
    return argument_hint(shown(param), where, given)


def _interrupted(error: BaseException) -> bool:
    """Whether ``error`` is how a library reported Ctrl-C: a ``KeyboardInterrupt`` in its chain
    of causes and contexts (ADBC's SQLite driver answers the cancel ADBC sends on SIGINT with
    ``NotSupportedError: NOT_IMPLEMENTED`` raised from the interrupt, and the freeze wraps that
    in a ``LiveStoreError``), or DuckDB's ``RuntimeError: Query interrupted``. A newcomer saw a
    traceback, or the store blamed, in 7 of 20 Ctrl-C's during loads, imports and freezes."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        if isinstance(current, RuntimeError) and str(current) == "Query interrupted":
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def entry() -> None:
    """The ``recs`` command (and ``python -m recs.cli``): ``main``, then exit with its code.

    After Ctrl-C the process must exit 130, not die of SIGINT. CPython 3.11 (what this project
    runs) sets its "unhandled KeyboardInterrupt" flag when an interrupt passes out of ``exec``
    of a source string, even when a caller catches it, and a ``python -m`` process with the flag
    set ends by SIGINT after finalizing. dbt's dataclasses and mashumaro generate code that way:
    Ctrl-C during dbt under ``python -m recs.cli`` died with exit -2 after ``recs: aborted`` in
    2 of 12 runs (6 at once, SIGINT 0.1-0.9 s into dbt), each time with the flag set (read with
    ctypes), and ``test_ctrl_c_inside_exec_of_a_source_string_still_exits_130`` shows it every
    time. Every ``exec`` of a string clears the flag as it starts, so one of nothing clears it
    once ``main`` has handled the interrupt; SIGINT is ignored while the interpreter shuts
    down. SIGTERM (a scheduler's or a supervisor's stop) stops the command as Ctrl-C does,
    clean-up included, and exits ``TERMINATED``: it used to kill the process outright, leaving
    e.g. ``recs evaluate``'s throwaway folder behind."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    code = main()
    if code in (ABORTED, TERMINATED):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        exec("pass")  # clears CPython's "unhandled KeyboardInterrupt" flag (above)
    sys.exit(code)
