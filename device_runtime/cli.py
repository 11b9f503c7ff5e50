"""`edgefl-device`: the command a device operator runs: `run` (join a coordinator), `train` (one set, no
coordinator), `info` (edgefl.device_runtime.info) and `build-native`."""
from __future__ import annotations

import argparse
import json
import sys

from edgefl.device_runtime import run_cmd, train_cmd
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edgefl-device", description="edgefl device agent")
    parser.add_argument("--version", action=_Version, help="print the edgefl version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="what this device offers: memory, cores, installed runtimes")
    info.add_argument("--format", choices=("table", "json"), default="table")
    train_cmd.add_parser(sub)
    run_cmd.add_parser(sub)
    build = sub.add_parser("build-native", help="build the native ExecuTorch trainer (edgefl-et-train) with cmake")
    build.add_argument("--target", help="linux-x86_64 | linux-aarch64 (cross-built; default: this machine)")
    build.add_argument("-o", "--output", help="build folder (default: the device cache, where agents find it)")
    args = parser.parse_args(run_cmd.main_argv(sys.argv[1:] if argv is None else argv))
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
