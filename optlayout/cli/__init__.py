"""The `optlayout` command line: thin commands that parse, call the library and print.

Each feature registers its commands from its own module; `main` turns every user error into one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import sys

import pydantic
import typer

from optlayout.errors import OptlayoutError, describe_validation_error

app = typer.Typer(
    name="optlayout",
    help="Decide how to lay out large-model training over a GPU cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Feature modules: each defines `register(app)`.
from optlayout.cli import accounting, checkpoint, emit, profile, runs, solve, topology  # noqa: E402

for _module in (accounting, checkpoint, emit, profile, runs, solve, topology):
    _module.register(app)


def main() -> None:
    """Console-script entry point."""
    try:
        code = app(standalone_mode=False)  # typer.Exit(n) comes back as the return value here
        if isinstance(code, int) and code:
            sys.exit(code)
    except OptlayoutError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except pydantic.ValidationError as exc:
        typer.echo(f"error: {describe_validation_error(exc)}", err=True)
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
        # Usage errors of the (vendored) click layer: bad flag, missing argument: one line too.
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            ctx = getattr(exc, "ctx", None)
            hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
            message = " ".join(str(exc.format_message()).split())
            typer.echo(f"error: {message}{hint}", err=True)
            sys.exit(exc.exit_code or 2)
        raise


if __name__ == "__main__":
    main()
