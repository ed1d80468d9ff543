"""How train.py and evaluate.py run and report errors: Hydra composes the config, and an error a user can act on
ends the process with one line on stderr that names the problem and the fix, no traceback, a non-zero exit code."""

from __future__ import annotations

import errno
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from gan.config.compose import hydra_message
from gan.errors import UNHEALTHY, ConfigError, Interrupted, RunError, StoppedAtOnce, Unhealthy

# A full disk, a file size limit or a quota: the write that failed says what to do.
DISK_FULL = (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def one_line(e: BaseException) -> str:
    """The message of ``e`` as one line."""
    if isinstance(e, OSError) and e.errno in DISK_FULL:
        return (f"cannot write {e.filename or 'to the run directory'} ({e.strerror}): free disk space or choose a "
                "writable directory; a checkpoint is written whole or not at all: a run resumes from its last")
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    # An error in a DataLoader worker is raised again in the main process with the worker's traceback
    # before its message (torch.utils.data's ExceptionWrapper): the message is the last line.
    lines = str(e).strip().splitlines() or [type(e).__name__]
    return lines[-1].removeprefix(f"{type(e).__module__}.{type(e).__qualname__}: ")


@contextmanager
def environment(name: str, value: str | None) -> Iterator[None]:
    """The environment variable ``name`` set to ``value`` (None: unset) inside the block."""
    previous = os.environ.get(name)
    set_variable(name, value)
    try:
        yield
    finally:
        set_variable(name, previous)


def set_variable(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def writer_thread_failed(args: threading.ExceptHookArgs) -> None:
    """threading's hook for an exception that ends a thread: a TensorBoard writer's failed write (a full disk) is
    raised again in the main thread at its next write or flush, and reported there in one line; others as usual."""
    writer = type(args.thread).__module__.startswith("tensorboard.") if args.thread is not None else False
    if not (writer and isinstance(args.exc_value, OSError)):
        threading.__excepthook__(args)


@contextmanager
def reported() -> Iterator[None]:
    """Errors a user can act on end the process inside the block: one line on stderr, an exit code
    (SystemExit, which Hydra lets through, where it would print a line of its own for an exception)."""
    hook, threading.excepthook = threading.excepthook, writer_thread_failed
    try:
        yield
    except ConfigError as e:
        report(f"error: {one_line(e)}", 2)
    except Unhealthy as e:
        report(str(e), UNHEALTHY)
    except (RunError, OSError) as e:
        report(f"error: {one_line(e)}", 1)
    except Interrupted as e:
        report(str(e), e.code)
    except StoppedAtOnce as e:
        report(e.message, e.code)
    except KeyboardInterrupt:
        report("interrupted", 130)
    except Exception as e:
        if (full := disk_full(e)) is None:
            raise
        report(f"error: {one_line(full)}", 1)
    finally:
        threading.excepthook = hook


def disk_full(e: BaseException | None) -> OSError | None:
    """The full disk behind ``e``, where its chain of causes holds one: a library may wrap a failed write in an error
    of its own (Lightning's TensorBoard logger raises a ValueError from the write its event writer failed)."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return e
        e = e.__cause__ or e.__context__
    return None


def report(line: str, code: int) -> None:
    print(line, file=sys.stderr)
    sys.exit(code)


def entry_point(task: Callable[[DictConfig], Any], config_path: str, config_name: str,
                overrides: Callable[[list[str]], list[str]] = list) -> Callable[[], None]:
    """The ``main()`` of train.py and evaluate.py: Hydra composes ``config_name`` from ``config_path``
    with the command line's overrides, as ``overrides`` rewrites them (train.py: ``data=X`` trains X's
    recipe), and calls ``task(cfg)``.

    Bad input ends the process with one line on stderr, without a traceback, and exit code 2: a
    ConfigError, or an error Hydra raises while composing (an unknown option or key, a malformed
    override). A run that cannot go on (RunError, OSError) ends the same way with exit code 1; a run
    stopped by a signal with 128 + its number, as a shell reports it (Ctrl-C 130, SIGTERM 143, SIGUSR1
    138). Hydra itself prints its errors over several lines
    and exits with 1; it raises them instead while HYDRA_FULL_ERROR=1 -- its documented switch --,
    which is therefore set while Hydra composes. The task runs, and starts any process (DDP ranks),
    under the user's own setting; with HYDRA_FULL_ERROR=1 every error keeps its traceback.
    """
    state: dict[str, Any] = {"user_setting": None, "task_started": False}

    @hydra.main(version_base="1.3", config_path=config_path, config_name=config_name)
    def compose_and_run(cfg: DictConfig) -> Any:
        state["task_started"] = True
        full_errors = state["user_setting"] == "1"
        with environment("HYDRA_FULL_ERROR", state["user_setting"]), nullcontext() if full_errors else reported():
            return task(cfg)  # a sweeper reads it (train.py: the value of metric=)

    def main() -> None:
        argv = sys.argv
        sys.argv = [argv[0], *overrides(argv[1:])]  # Hydra reads them there, as do the DDP ranks it starts
        try:
            run()
        finally:
            sys.argv = argv

    def run() -> None:
        state["user_setting"], state["task_started"] = os.environ.get("HYDRA_FULL_ERROR"), False
        if state["user_setting"] == "1":
            return compose_and_run()
        with reported():  # e.g. Ctrl-C, or a disk too full for Hydra's .hydra/, before the task runs
            try:
                with environment("HYDRA_FULL_ERROR", "1"):
                    compose_and_run()
            except (HydraException, OmegaConfBaseException) as e:
                if state["task_started"]:  # not bad input: an error of the task's own, with its traceback
                    raise
                report(f"error: {hydra_message(e)}", 2)

    return main
