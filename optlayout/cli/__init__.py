"""The `optlayout` command line: thin commands that parse, call the library and print.

Each feature registers its commands from its own module (`register(app)`); a command's module is imported
only when that command runs, so `optlayout --help` and the light commands (`mfu`, `memory`, `checkpoint`)
never load OR-Tools, networkx, numpy or scipy. `main` turns every user error into one line on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Iterator, MutableMapping
from importlib import import_module
from typing import TYPE_CHECKING, Any

IMPORTED_S = time.perf_counter()  # the console script imports this module first: about when the command began

import typer  # noqa: E402
from typer.core import TyperCommand, TyperGroup  # noqa: E402

from optlayout.errors import OptlayoutError, describe_validation_error  # noqa: E402

if TYPE_CHECKING:
    from typer._click import Command, Context, HelpFormatter

COMMANDS: dict[str, tuple[str, str]] = {
    "mfu": ("accounting", "Model FLOPs utilization from measured tokens/s per GPU."),
    "memory": (
        "accounting",
        "Memory per GPU: training state (always), activations when a model shape and sequence are given.",
    ),
    "estimate": (
        "accounting",
        "A full prediction for one given layout: memory, step time and where the time goes.",
    ),
    "checkpoint": (
        "checkpoint",
        "Optimal checkpoint interval (Young or Daly), time lost per failure and effective training time.",
    ),
    "emit": ("emit", "Print launcher flags or a config file for one layout."),
    "profile": (
        "profile",
        "Top ops by self time, time by category, NCCL overlap, per-rank step times and a verdict.",
    ),
    "compare": (
        "runs",
        "Per run: measured vs predicted throughput and MFU, the rank of the measured layout, the solver's pick.",
    ),
    "calibrate": (
        "runs",
        "Fit the calibratable constants per GPU and precision; report cross-validated error by source.",
    ),
    "solve": (
        "solve",
        "The layouts with the highest predicted MFU (or goodput), proven optimal within the cost model;\n"
        "with --from-plan, the best layout of a saved plan on another GPU count and what changes.",
    ),
    "explain": (
        "solve",
        "Where your own layout ranks among all legal layouts, and which terms cost it against the best.",
    ),
    "runs": ("runs", "Measured-run records: make them from training logs."),
    "topology": ("topology", "Cluster topology files: show one, or discover one from a cluster."),
}
"""Every command: the `optlayout.cli` module that registers it, and its help line for `optlayout --help`
(a test checks each against the command's own docstring)."""


def load_command(name: str) -> Command:
    """The click command `name`, from its module's `register` (the module is imported now)."""
    module = import_module(f"optlayout.cli.{COMMANDS[name][0]}")
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.callback()(lambda: None)  # a group, even for a module with one command
    module.register(app)
    return typer.main.get_group(app).commands[name]


class _CommandTable(MutableMapping[str, "Command"]):
    """The group's commands by name: every name of `COMMANDS`, each command built on first use."""

    def __init__(self) -> None:
        self._loaded: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in COMMANDS:
            raise KeyError(name)
        if name not in self._loaded:
            self._loaded[name] = load_command(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter(COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS)


class LazyCommands(TyperGroup):
    """A command group that imports a command's module only when the command is used; the command list of
    `--help` is written from `COMMANDS` without importing any."""

    _listing = False

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = _CommandTable()

    def list_commands(self, ctx: Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        if self._listing and cmd_name in COMMANDS:
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1])
        return self.commands.get(cmd_name)

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="optlayout",
    help="Decide how to lay out large-model training over a GPU cluster.",
    cls=LazyCommands,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    pass


main_started_s: float | None = None
"""When `main` began the command (`IMPORTED_S`); None when a command runs in-process without it (tests)."""


def command_started_s() -> float:
    """Where a command's wall clock starts: the module import under `main`, else now."""
    return main_started_s if main_started_s is not None else time.perf_counter()


GC_THRESHOLDS = (1_000_000, 50, 1_000)
"""The command process's garbage-collector thresholds (Python's: 700, 10, 10): a command allocates its imports'
and its search's objects by the hundred thousand, nearly none of them cyclic garbage, and each young-generation
collection rescans the objects allocated since the last (every 700 by default). At 100,000 a solve still ran about
20 collections after its imports (0.11 s of CPU for 405B on 256 GPUs, 0.18 s for DeepSeek-V3 on 2,048, each
finding under 700 objects of garbage) and `compare`'s count 28 (0.55 s of 9.5 s on a 43-run subset); at 1,000,000
none of them runs one, with the same peak memory (199 MB on that subset), measured with `gc.callbacks`. Cyclic
garbage waits for at most a million net allocations. Set in `main` only: a library caller keeps its own."""


def main() -> None:
    """Console-script entry point."""
    global main_started_s
    main_started_s = IMPORTED_S
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        _main()
    finally:
        _note_replaced_gpus()


def _note_replaced_gpus() -> None:
    """A note on stderr for each shipped GPU preset `OPTLAYOUT_GPU_FILE` replaces, once a command read presets."""
    presets = sys.modules.get("optlayout.presets")
    if presets is None:
        return
    for name in presets.replaced_presets():
        typer.echo(
            f"note: {presets.GPU_FILE_ENV} ({os.environ[presets.GPU_FILE_ENV]}) replaces the shipped GPU preset "
            f"{name!r} with its own figures, for every topology, run and calibration naming {name}; give the GPU "
            "another name to keep the preset",
            err=True,
        )


def _main() -> None:
    try:
        code = app(standalone_mode=False)  # typer.Exit(n) comes back as the return value here
        if isinstance(code, int) and code:
            sys.exit(code)
    except OptlayoutError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:  # a path the user gave cannot be read or written
        where = f": {exc.filename}" if exc.filename else ""
        typer.echo(f"error: {exc.strerror or exc}{where}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("aborted", err=True)
        sys.exit(1)
    except Exception as exc:
        pydantic = sys.modules.get("pydantic")  # a ValidationError can only come from a loaded pydantic
        if pydantic is not None and isinstance(exc, pydantic.ValidationError):
            typer.echo(f"error: {describe_validation_error(exc)}", err=True)
            sys.exit(2)
        # Usage errors of the (vendored) click layer: bad flag, missing argument: one line too.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            message = " ".join(str(exc.format_message()).split())
            typer.echo(f"error: {message}{hint}", err=True)
            sys.exit(exc.exit_code or 2)
        raise


def run() -> None:
    """The process's entry point (the console script, `python -m optlayout[.cli]`): `main`, then every object moved
    to the collector's permanent generation (`gc.freeze`) as the process ends. The interpreter's shutdown then skips
    the full collections it runs while it tears the modules down, which rescan the imports' and the search's objects
    (about 0.2 s of CPU of a 2 s solve, measured). Objects are still freed by reference count and stdout and stderr
    flush as before; only cyclic garbage left at the very end is not collected (its memory goes back with the
    process's; Python promises no finalizer at exit either). Not in `main`: an in-process caller (the tests) keeps
    its collector as it was."""
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":
    run()
