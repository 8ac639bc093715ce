"""The `kvplan` command group: commands load only when asked for, kvplan's errors become exit codes."""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, TypeVar

import typer

from kvplan.errors import KvplanError

if TYPE_CHECKING:
    import click
    from rich.console import Console

P = ParamSpec("P")
R = TypeVar("R")

# name -> (module, attribute): a function for a command, a Typer for a group. Only the command
# that runs is imported and built, so a plain estimate does not pay for the others.
COMMANDS: dict[str, tuple[str, str]] = {
    "estimate": ("kvplan.cli.estimate", "estimate"),
    "calibrate": ("kvplan.cli.calibrate", "calibrate"),
    "check-log": ("kvplan.cli.check_log", "check_log"),
    "solve": ("kvplan.cli.solve", "solve"),
    "simulate": ("kvplan.cli.simulate", "simulate"),
    "models": ("kvplan.cli.listing", "models"),
    "gpus": ("kvplan.cli.listing", "gpus"),
    "compare": ("kvplan.cli.compare", "app"),
}


# Help is click's plain layout: it wraps at the terminal's width (80 when not a terminal) and never
# cuts an option name to `--max-model-len,…` as rich's option table did; `[...]` in help is text.
HELP_MARKUP = None


# typer's UsageError (its vendored click's, or click's): the base of its BadParameter
_USAGE_ERROR: type[Exception] = typer.BadParameter.__bases__[0]


def _one_line(exc: Any, argv: list[str]) -> typer.Exit:
    """A usage error (a missing or unknown option) as the one `error:` line every error gets; asked
    for no arguments, a command still prints its help."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        raise exc
    where = f"; see `{exc.ctx.command_path} --help`" if exc.ctx is not None else ""
    message = f"{exc.format_message().rstrip('.')}{where}"
    name = getattr(exc, "option_name", None)
    if type(exc).__name__ == "NoSuchOption" and name and not name.startswith("--"):
        # click reads an unknown `-dp` as `-d` then `p`: name the option as typed
        typed = next(
            (a for a in argv if a.startswith(name) and not a.startswith("--") and len(a) > len(name)), None
        )
        if typed is not None:
            message = f"No such option: {typed}{where}"
    if _argv_wants_json(argv):  # the README's promise: under --json stdout always gets an object
        from kvplan.errors import UsageError
        from kvplan.render.jsonout import to_json

        typer.echo(to_json(UsageError(message).to_dict() | {"exit_code": exc.exit_code}))
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(exc.exit_code)


def _argv_wants_json(argv: list[str]) -> bool:
    """--json, or compare's --format json, among arguments the parser could not read."""
    if "--json" in argv or "--format=json" in argv:
        return True
    return any(a == "--format" and b == "json" for a, b in zip(argv, argv[1:], strict=False))


class WholeHelpGroup(typer.core.TyperGroup):
    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Each command's whole first sentence, wrapped: click's default cuts it to `...`."""
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class _LazyGroup(WholeHelpGroup):
    def make_context(
        self, info_name: str | None, args: list[str], *rest: Any, **kwargs: Any
    ) -> click.Context:
        given = list(args)
        try:
            return super().make_context(info_name, args, *rest, **kwargs)
        except _USAGE_ERROR as exc:
            raise _one_line(exc, given) from None

    def invoke(self, ctx: click.Context) -> Any:
        given = [*getattr(ctx, "_protected_args", []), *ctx.args]  # the command and its arguments, as typed
        try:
            return super().invoke(ctx)
        except _USAGE_ERROR as exc:
            raise _one_line(exc, given) from None

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attr = COMMANDS[cmd_name]
        target = getattr(importlib.import_module(module), attr)
        if not isinstance(target, typer.Typer):
            single = typer.Typer(add_completion=False, rich_markup_mode=HELP_MARKUP)
            single.command(cmd_name)(target)
            target = single
        command = typer.main.get_command(target)
        command.name = cmd_name
        return command


app = typer.Typer(
    cls=_LazyGroup,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=HELP_MARKUP,
    help="KV-cache capacity planner: how many GPUs, which context, which KV dtype, how many users.",
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from kvplan import __version__

        typer.echo(f"kvplan {__version__}")
        raise typer.Exit()


@app.callback()
def _group(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print kvplan's version and exit."
        ),
    ] = False,
) -> None:
    # a callback makes typer build a group although no command is registered up front; an output whose
    # encoding has no character kvplan prints (LC_ALL=C, PYTHONIOENCODING=ascii) gets '?', never a traceback
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and not (stream.encoding or "").lower().startswith("utf"):
            stream.reconfigure(errors="replace")


def _wants_json(kwargs: dict[str, Any]) -> bool:
    return kwargs.get("json_out") is True or kwargs.get("fmt") == "json"


def reports_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn kvplan's own errors into one message on stderr and the documented exit code; under
    --json (or --format json) the error's JSON object goes to stdout as well."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            try:
                return func(*args, **kwargs)
            except OSError as exc:
                # a path the system will not look up (a name over 255 bytes, a loop): one line naming it
                if exc.filename is None:
                    raise
                from kvplan.errors import UsageError

                raise UsageError(
                    f"{str(exc.filename)[:80]}: {exc.strerror or exc}; check the file name"
                ) from None
        except KvplanError as exc:
            if _wants_json(kwargs):
                from kvplan.render.jsonout import to_json

                typer.echo(to_json(exc.to_dict()))
            from rich.markup import escape

            make_console(stderr=True, soft_wrap=True).print(
                f"[bold red]error:[/] {escape(str(exc))}", highlight=False
            )
            raise typer.Exit(exc.exit_code) from None

    return wrapper


MIN_WIDTH = 80  # narrower terminals (or COLUMNS=0) get 80-column output their terminal wraps: no value cut


def make_console(stderr: bool = False, soft_wrap: bool = False) -> Console:
    """A rich console at the terminal's width, or MIN_WIDTH where that is narrower (or unreadable)."""
    from rich.console import Console

    out = Console(stderr=stderr, soft_wrap=soft_wrap)
    return out if out.width >= MIN_WIDTH else Console(stderr=stderr, soft_wrap=soft_wrap, width=MIN_WIDTH)


def console() -> Console:
    """Where tables go; rich is loaded only to print them (never for --json)."""
    return make_console()


def main() -> None:
    """Console-script entry point."""
    app()
