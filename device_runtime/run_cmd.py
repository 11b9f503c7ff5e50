"""`edgefl-device run --id ID --broker URL ...` (also `edgefl-device --id ID ...`): join a coordinator and
train what it sends until stopped (SIGTERM / Ctrl-C) or `--rounds` rounds are done.

One agent per device id and broker on a machine (`one_agent`): two agents with one id take the broker connection
from each other every second (the broker closes the older connection for the newer, whose twin reconnects and
closes it in turn), and nothing says so: mosquitto 2.0 closes the socket without MQTT 5's session-taken-over
reason, and MQTT 3.1.1 has none. A second agent is refused before it connects, naming the first's pid; two
machines using one id are the operator's to keep apart (the broker log shows 'already connected')."""
from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from edgefl.units import format_bytes, parse_bytes


def add_parser(sub) -> None:
    from edgefl.device_runtime.help_format import Help

    p = sub.add_parser("run", help="join a coordinator over MQTT and train what it sends (the default command: "
                                   "'edgefl-device --id ID ...' is 'edgefl-device run --id ID ...')",
                       description="Join a coordinator over MQTT and train what it sends until stopped; "
                                   "'edgefl-device --id ID ...' means the same.", formatter_class=Help)
    p.add_argument("--id", required=True, help="this device's id (its login name on the broker)")
    p.add_argument("--broker", required=True, metavar="URL", help="mqtt://HOST:PORT or mqtts://HOST:PORT")
    p.add_argument("--credentials", type=Path, metavar="FILE", help="this device's login file {username, password}")
    p.add_argument("--ca-file", type=Path, metavar="FILE", help="the broker's CA certificate (mqtts)")
    p.add_argument("--data", required=True, type=Path, metavar="PATH",
                   help="folder with x.npy and y.npy, or an .npz with x and y")
    p.add_argument("--runtime", choices=("ort", "executorch", "torch"),
                   help="the training runtime (default: the --profile's)")
    p.add_argument("--trainer", choices=("auto", "native", "python"), default="auto",
                   help="ExecuTorch sets: the native trainer (auto, built with 'edgefl-device build-native') or the "
                        "Python reference trainer (imports torch)")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "edgefl-device", metavar="DIR",
                   help="sha256-addressed artifact cache")
    p.add_argument("--cache-budget", default="128MiB", metavar="SIZE",
                   help="what the cache may keep beyond the current round's set, e.g. 512MiB (least used goes first)")
    p.add_argument("--receipt-wait", type=float, default=30.0, metavar="SECONDS",
                   help="seconds a report waits for the coordinator's receipt before it is sent again (doubling)")
    p.add_argument("--memory", metavar="SIZE", help="peak training memory this device grants, e.g. 180MiB "
                                                    "(default: its fleet group's budget, which the coordinator sends "
                                                    "with each round, else the --profile's; instructions predicted "
                                                    "above it are refused)")
    p.add_argument("--profile", help="hardware profile name (hardware/profiles): default memory and power")
    p.add_argument("--energy", default="auto", help="what measures energy: auto | rapl | ina219 | battery | profile "
                                                    "(the training process's, not the agent's)")
    p.add_argument("--i2c-bus", type=int, metavar="N", help="I2C bus of an INA219 power monitor (1 on a Raspberry Pi)")
    p.add_argument("--power", metavar="WATTS", help="active power for the energy estimate when no sensor is present, "
                                                    "e.g. 3W")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="threads the training process uses")
    p.add_argument("--enforce-memory", action="store_true",
                   help="kill a training process that goes over --memory, as the device's OOM killer would")
    p.add_argument("--rounds", type=int, metavar="N", help="stop after this many rounds (default: serve until stopped)")


def _device_facts(args) -> tuple[int | None, int | None, float, str]:
    """(memory declared with --memory, the profile's memory budget, active power W, runtime): --power/--runtime,
    else the profile, else 0 W (a sensor must measure) / an error."""
    from edgefl.errors import ConfigError
    from edgefl.hardware.profiles import load_profile
    from edgefl.units import parse_watts

    profile = load_profile(args.profile) if args.profile else None
    runtime = args.runtime or (profile.runtime if profile else None)
    if runtime is None:
        raise ConfigError("--runtime: not given and no --profile to take it from; give --runtime ort|executorch|torch "
                          "or the device's --profile")
    memory = size_option("--memory", args.memory) if args.memory else None
    if args.power:
        try:
            power = parse_watts(args.power)
        except ValueError as exc:
            raise ConfigError(f"--power: {exc}") from None
    elif profile:
        power = profile.power_active_w
    else:
        power = 0.0   # fine with a sensor; without one select_meter asks for --power or --profile
    return memory, profile.memory_budget_bytes if profile else None, power, runtime


def size_option(option: str, text: str) -> int:
    from edgefl.errors import ConfigError

    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise ConfigError(f"{option}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from edgefl.device_runtime.agent import DeviceAgent
    from edgefl.device_runtime.local_data import check_values, open_local_data
    from edgefl.device_runtime.mqtt_link import MqttLink
    from edgefl.device_runtime.native import choose
    from edgefl.hardware.energy import select_meter

    from edgefl.device_runtime.peaks import return_large_buffers

    return_large_buffers()    # before the agent allocates: what it holds between rounds stays near its idle size
    held = one_agent(args.id, args.broker)
    # what holds for any model, before connecting: every round would fail on it (each round's set is
    # checked against its own manifest when it arrives)
    check_values(*open_local_data(args.data))
    memory, profile_memory, power, runtime = _device_facts(args)
    def meter():
        return select_meter(args.energy, power_active_w=power, i2c_bus=args.i2c_bus)

    meter()   # a missing sensor or power figure fails now, not in the middle of a round
    choose(runtime, args.trainer)   # and so does an unbuilt native trainer, before connecting

    link = MqttLink(args.broker, args.id, args.credentials, args.cache, ca_file=args.ca_file,
                    receipt_s=args.receipt_wait, cache_budget_bytes=size_option("--cache-budget", args.cache_budget))
    agent = DeviceAgent(link, args.id, args.data, runtime, memory_bytes=memory, profile_memory_bytes=profile_memory,
                        meter=meter, threads=args.threads, enforce_memory=args.enforce_memory, trainer=args.trainer,
                        log=lambda line: print(f"{args.id}: {line}", flush=True))
    stop = threading.Event()

    def stopping(*_) -> None:     # ends a fetch or a training at once: the agent exits within seconds
        stop.set()
        link.stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)
    link.announce(agent.profile({"profile": args.profile, "power_w": power}))
    print(f"{args.id}: online at {args.broker}, runtime {runtime}"
          + (f" (native trainer {agent.native})" if agent.native else "")
          + (f", memory {format_bytes(memory)}" if memory else ", memory: its group's budget, sent with each round"),
          flush=True)
    try:
        agent.serve(stop, args.rounds)
    finally:
        link.close()
        held.close()
    return 0


def one_agent(device_id: str, broker: str):
    """This machine's claim on `device_id` at `broker` (module doc), held until closed or the process ends."""
    import os
    import socket
    import tempfile

    from edgefl.outdir import exclusive
    from edgefl.protocol.broker_address import parse_broker_url

    address = parse_broker_url(broker)
    try:
        host = socket.gethostbyname(address.host)     # localhost and 127.0.0.1 are one broker
    except OSError:
        host = address.host
    lock = Path(tempfile.gettempdir()) / f"edgefl-device-{os.getuid()}" / f"{host}-{address.port}-{device_id}.lock"
    return exclusive(lock, lambda pid: f"{device_id}: another edgefl-device (pid {pid}) runs as {device_id} at "
                     f"{address.url} on this machine; stop it first (two agents with one id take the broker "
                     "connection from each other every second)")


def main_argv(argv: list[str]) -> list[str]:
    """`edgefl-device --id ...` means `edgefl-device run --id ...`."""
    if argv and argv[0].startswith("--") and argv[0] not in ("-h", "--help", "--version"):
        return ["run", *argv]
    return argv


