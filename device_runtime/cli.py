"""`edgefl-device`: the command a device operator runs: `run` (join a coordinator), `train` (one set, no
coordinator), `info` (edgefl.device_runtime.info) and `build-native`."""
from __future__ import annotations

import argparse
import json
import sys

from edgefl.device_runtime import run_cmd, train_cmd
from edgefl.device_runtime.help_format import Help
from edgefl.device_runtime.info import device_info, version
from edgefl.errors import EdgeflError


def _build_native(args) -> int:
    from pathlib import Path

    from edgefl.device_runtime import native

    binary = native.build(args.target, Path(args.output) if args.output else None,
                          log=lambda line: print(line, flush=True))
    print(f"built {binary}")
    return 0


class _Version(argparse.Action):
    """--version, looked up only when asked: reading package metadata costs every start tens of ms."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"edgefl-device {version()}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    """edgefl-device's commands and their options."""
    parser = argparse.ArgumentParser(
        prog="edgefl-device", formatter_class=Help, epilog="'edgefl-device --id ID --broker URL ...' (no command) "
        "means 'edgefl-device run --id ID --broker URL ...'; 'edgefl-device COMMAND --help' shows a command's options.",
        description="The edgefl device agent: join a coordinator and train what it sends (run), train one artifact "
                    "set on local data (train), show what this device offers (info), build the native trainer.")
    parser.add_argument("--version", action=_Version, help="print the edgefl version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    info = sub.add_parser("info", help="what this device offers: memory, cores, installed runtimes",
                          formatter_class=Help)
    info.add_argument("--format", choices=("table", "json"), default="table", help="a table to read, or JSON")
    train_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    build = sub.add_parser("build-native", help="build the native ExecuTorch trainer (edgefl-et-train) with cmake",
                           formatter_class=Help)
    build.add_argument("--target", help="linux-x86_64 | linux-aarch64 (cross-built; default: this machine)")
    build.add_argument("-o", "--output", metavar="DIR",
                       help="build folder (default: the device cache, where agents find it)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(run_cmd.main_argv(sys.argv[1:] if argv is None else argv))
    if args.command in ("train", "run", "build-native"):
        try:
            if args.command == "build-native":
                return _build_native(args)
            return (train_cmd if args.command == "train" else run_cmd).run(args)
        except EdgeflError as exc:
            print(f"edgefl-device: error: {exc}", file=sys.stderr)
            return 2
    facts = device_info()
    if args.format == "json":
        print(json.dumps(facts, indent=2))
    else:
        for key, value in facts.items():
            if key == "runtimes":
                value = ", ".join(f"{k}: {'installed' if v else 'missing'}" for k, v in value.items())
            print(f"{key:16} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
