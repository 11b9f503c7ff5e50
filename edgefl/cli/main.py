"""`edgefl` entry point: the subcommands, and the one place user errors become one line + exit 2.

Each command module parses its options, calls one room and prints (edgefl.cli.console). Rooms are imported
inside the commands, so `edgefl --help` imports neither torch nor the export backends."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from edgefl.cli import options as o
from edgefl.cli.broker_cmd import broker_app
from edgefl.cli.console import stdout
from edgefl.cli.data_cmd import data_app
from edgefl.cli.device_cmd import device_app
from edgefl.cli.emulate_cmd import emulate
from edgefl.cli.export_cmd import export
from edgefl.cli.fleet_cmd import fleet_app
from edgefl.cli.flower_cmd import flower
from edgefl.cli.plan_cmd import calibrate, plan, profile
from edgefl.cli.pretrain_cmd import pretrain
from edgefl.cli.serve_cmd import serve
from edgefl.cli.status_cmd import status, version
from edgefl.errors import EdgeflError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Federated learning that fits every device's memory budget.")


def report(runs: Annotated[list[Path], typer.Argument(metavar="RUN", help="one or more run folders written by "
                                                      "'edgefl emulate -o' or 'edgefl serve --state'")],
           output: Annotated[Path, typer.Option("-o", "--output", help="folder for index.html and the PNGs (refused "
                                                "if it holds files)")] = Path("report"),
           force: o.Force = False):
    """A static HTML page with plots and tables comparing runs."""
    from edgefl.report import write_report

    stdout.print(f"report written to {write_report(runs, output, force=force)}")


app.callback(invoke_without_command=True, no_args_is_help=True)(version)
for command in (plan, profile, emulate, flower, serve, status, pretrain, export, calibrate, report):
    app.command()(command)
for name, group in (("fleet", fleet_app), ("broker", broker_app), ("device", device_app), ("data", data_app)):
    app.add_typer(group, name=name)


def command():
    """The click command the console script runs: the app, its values named plainly in --help."""
    return o.plain_metavars(typer.main.get_command(app))


def run() -> None:
    """Console-script entry: user errors print one line on stderr and exit 2; bugs keep their traceback."""
    try:
        command()(standalone_mode=True)
    except EdgeflError as exc:
        print(f"edgefl: error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run()
