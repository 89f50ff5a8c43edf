"""Domain errors and the exit codes they map to.

Every error a user can cause or fix derives from UmprovError and carries its exit code;
the CLI's error boundary (umprov.cli.main) prints ``str(error)`` as one line (an error that
gathered several problems of one input, such as an inventory's, prints one line for each, as a
linter does: ``error.lines()``) and exits with ``error.exit_code``. Anything else is a bug:
one line plus a log file with the traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum


class ExitCode(IntEnum):
    """Documented exit codes (README, "Exit codes"). Values are part of the public interface."""

    OK = 0
    FAILED = 1  # the command ran and some work failed (see the summary)
    USAGE = 2  # bad command line (Click's own code)
    INVENTORY = 3  # the inventory is missing, malformed or invalid
    CONFIG = 4  # a bad value: option, variable, profile or spec file
    ENVIRONMENT = 5  # a missing prerequisite: Docker engine, debootstrap, a tool
    TRUST = 6  # an unknown or changed SSH host key
    HOSTS_FAILED = 10  # one or more hosts failed
    HOSTS_UNREACHABLE = 11  # one or more hosts could not be reached (and none failed otherwise)
    VERIFY_WARN = 12  # verification finished with warnings only
    VERIFY_FAIL = 13  # verification found a failing check
    SCHEDULER = 14  # the scheduler refused or failed the job: a node out of service, srun's error
    INTERNAL = 70  # a bug in umprov: see the log file named in the message
    HANGUP = 129  # SIGHUP: the terminal or SSH session went away
    INTERRUPTED = 130  # Ctrl-C (SIGINT)
    TERMINATED = 143  # SIGTERM


class UmprovError(Exception):
    """An error with a one-line message for people and a distinct exit code."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, exit_code: ExitCode | None = None,
                 more: Sequence[str] = ()) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code
        self.more = tuple(more)  # further problems of the same input, one message each

    def __str__(self) -> str:
        # One line, always: multi-line library messages are folded.
        first = _folded(str(self.args[0])) if self.args else self.__class__.__name__
        return first + (f" (and {len(self.more)} more)" if self.more else "")

    def lines(self) -> list[str]:
        """Every problem, one line each, as a linter lists them (the error boundary prints
        these); a single problem is ``[str(self)]``."""
        if not self.more:
            return [str(self)]
        return [_folded(str(self.args[0])), *map(_folded, self.more)]


def _folded(message: str) -> str:
    return " ".join(message.split())


class InventoryError(UmprovError):
    exit_code = ExitCode.INVENTORY


class ConfigError(UmprovError):
    exit_code = ExitCode.CONFIG


class EnvironmentProblem(UmprovError):
    exit_code = ExitCode.ENVIRONMENT


class TrustError(UmprovError):
    exit_code = ExitCode.TRUST


class Interrupted(UmprovError):
    exit_code = ExitCode.INTERRUPTED


class Unreachable(UmprovError):
    """The host did not answer on its SSH port (or the name does not resolve), or the
    connection was lost mid-run."""

    exit_code = ExitCode.HOSTS_UNREACHABLE


class AuthFailed(UmprovError):
    """SSH answered, but refused our key."""

    exit_code = ExitCode.HOSTS_FAILED


class EngineDown(UmprovError):
    """SSH works, the Docker engine on the host does not answer."""

    exit_code = ExitCode.HOSTS_FAILED


class DeployFailed(UmprovError):
    """The container could not be delivered or started on a host."""

    exit_code = ExitCode.HOSTS_FAILED


class SchedulerFailed(UmprovError):
    """Slurm did not run the job: a node out of service, or srun failed before any task ran."""

    exit_code = ExitCode.SCHEDULER


class Terminated(BaseException):  # noqa: N818 - a signal, like KeyboardInterrupt
    """SIGTERM or SIGHUP, raised in the main thread by the CLI's handler (exit 143 or 129).

    A BaseException, like KeyboardInterrupt for SIGINT: the ``except Exception`` that keeps one
    host's trouble from stopping the others must not swallow it, so a run stops everywhere and
    goes through the same clean-up as Ctrl-C.
    """

    def __init__(self, signame: str = "SIGTERM") -> None:
        super().__init__(signame)
        self.signame = signame

    @property
    def exit_code(self) -> int:
        return ExitCode.HANGUP if self.signame == "SIGHUP" else ExitCode.TERMINATED


class Cancelled(BaseException):  # noqa: N818 - not an error: the run was interrupted
    """Raised in a per-host task once the run was interrupted (umprov.hosts.fanout); a
    BaseException so that the per-host ``except Exception`` handlers let it through."""
