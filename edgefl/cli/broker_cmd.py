"""`edgefl broker config` and `edgefl broker up`: the deployment files of a fleet's MQTT broker, and
running it."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from edgefl.errors import ConfigError

broker_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                         help="The fleet's MQTT broker: deployment files (config) and running it (up).")


def _largest_transfer(plan_path: Path, fleet) -> Optional[int]:
    """The most bytes any device of the plan sends or receives in one round."""
    from edgefl.planning.plan import Plan, verify

    plan = verify(Plan.read(plan_path), fleet)
    sizes = [max(s.predicted.upload_bytes, s.predicted.download_bytes)
             for g in plan.groups.values() for s in g.steps]
    return max(sizes, default=None)


@broker_app.command("config")
def config(
    devices: Path = typer.Option(..., "--devices", help="fleet.yaml: one login per device it lists"),
    output: Path = typer.Option(..., "-o", "--output", help="deployment folder to write (or update)"),
    tls: bool = typer.Option(True, "--tls/--plain", help="a TLS listener with a generated CA and server certificate "
                             "(the default); --plain: plain-text MQTT, logins and models in the clear, on this "
                             "machine only unless --bind says otherwise"),
    port: Optional[int] = typer.Option(None, "--port", help="listener port (default 8883, 1883 with --plain)"),
    bind: Optional[str] = typer.Option(None, "--bind", help="listen on this address only (default: all; with "
                                                             "--plain 127.0.0.1)"),
    hosts: Optional[list[str]] = typer.Option(None, "--host", help="name clients dial, for the TLS certificate "
                                                                   "(repeatable; default: this machine's names)"),
    plan: Optional[Path] = typer.Option(None, "--plan", help="plan.json: size the packet limit from its transfers"),
    max_packet_size: Optional[str] = typer.Option(None, "--max-packet-size", help="override the packet limit, "
                                                                                  "e.g. 4MiB"),
    rotate: bool = typer.Option(False, "--rotate", help="issue every login a new password (existing ones are "
                                                        "kept otherwise)"),
):
    """Write a mosquitto deployment: config, logins, ACL, TLS, systemd unit, docker-compose file."""
    from edgefl.broker import write_deployment
    from edgefl.fleet import load_fleet
    from edgefl.units import parse_bytes

    fleet = load_fleet(devices)
    if not tls:
        bind = bind or "127.0.0.1"
    override = None
    if max_packet_size is not None:
        try:
            override = parse_bytes(max_packet_size)
        except ValueError as exc:
            raise ConfigError(f"--max-packet-size: {exc}") from None
    largest = _largest_transfer(plan, fleet) if plan is not None else None
    ids = [d for g in fleet.groups for d in g.device_ids]
    groups = {d: g.name for g in fleet.groups for d in g.device_ids}
    for line in write_deployment(output, fleet.name, ids, port=port, bind=bind, tls=tls, hosts=hosts or None,
                                 largest_transfer=largest, max_packet_size=override, rotate=rotate, groups=groups):
        print(line)
    if not tls:
        print(f"warning: --plain: MQTT without TLS on {bind}: passwords and models cross the network in the clear; "
              "leave --plain out for TLS", file=sys.stderr)
    print(f"start it with: edgefl broker up --config {output}")


@broker_app.command("up")
def up(
    config: Path = typer.Option(Path("."), "--config", help="folder written by 'edgefl broker config'"),
    embedded: bool = typer.Option(False, "--embedded", help="use the embedded Python broker even when mosquitto "
                                                            "is installed (demos, tests)"),
):
    """Run the broker in the foreground: mosquitto if installed, else the embedded Python broker.
    Ctrl-C or SIGTERM stops it; SIGHUP reloads logins and ACL after a new 'edgefl broker config'."""
    from edgefl.broker import EMBEDDED_WARNING, broker_command, run_foreground

    argv, kind = broker_command(config, embedded)
    if kind == "embedded":
        why = "as --embedded asks" if embedded else "because mosquitto is not installed"
        print(EMBEDDED_WARNING.format(why=why), file=sys.stderr, flush=True)
    else:
        print(f"edgefl: running {argv[0]} with {config / 'mosquitto.conf'}", file=sys.stderr, flush=True)
    raise typer.Exit(run_foreground(argv, config))
