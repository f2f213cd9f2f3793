"""What every command shares: one error line per PrismError, and numbers
checked against their option's bounds."""

from __future__ import annotations

import click

from prism_debug.errors import PrismError
from prism_debug.process.options import option_number


class ErrorsAsLines(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except PrismError as exc:
            click.echo(f"prism-debug: error: {exc}", err=True)
            ctx.exit(int(exc.exit_code))


class Number(click.ParamType):
    """A number within its option's bounds (process/options.py OPTION_BOUNDS): one
    error line naming the option, as every PrismError, not click's usage text."""

    name = "number"

    def __init__(self, bounds: str | None = None) -> None:
        self.bounds = bounds  # the OPTION_BOUNDS entry, when not the option's own

    def convert(self, value, param, ctx):
        return option_number(param.opts[0], value, self.bounds)


NUMBER = Number()
