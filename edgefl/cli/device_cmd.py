"""`edgefl device bundle`: the tarball that installs the device agent on a Raspberry Pi, offline."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

device_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                         help="What devices install: the Raspberry Pi bundle (bundle).")


@device_app.command("bundle")
def bundle(
    target: str = typer.Option("linux-aarch64", "--target", help="linux-aarch64 (64-bit Raspberry Pi OS) | "
                                                                  "linux-x86_64"),
    output: Optional[Path] = typer.Option(None, "-o", "--output",
                                          help="tarball to write (default: edgefl-pi.tar.gz for linux-aarch64, "
                                               "else edgefl-<target>.tar.gz)"),
    force: bool = typer.Option(False, "--force", help="overwrite an existing output"),
    with_python: bool = typer.Option(False, "--with-python", help="also the wheels of edgefl and its base "
                                     "dependencies (no torch, no ONNX Runtime), for the Python tools on the device"),
):
    """Cross-build the native device agent and trainer and collect them, the trainer's libraries, install.sh
    and a systemd unit into one tarball: a device needs no Python. Two bundles of one source tree are the
    same bytes."""
    from edgefl.device_runtime.bundle import build_bundle, contents
    from edgefl.units import format_bytes

    if output is None:
        output = Path("edgefl-pi.tar.gz" if target == "linux-aarch64" else f"edgefl-{target}.tar.gz")
    path = build_bundle(target, output, log=lambda line: print(line, file=sys.stderr, flush=True), force=force,
                        with_python=with_python)
    print(f"bundle written to {path} ({format_bytes(path.stat().st_size)}), for {target}:")
    for entry, (files, size) in sorted(contents(path).items()):
        count = f"{files} file{'' if files == 1 else 's'}, " if entry.endswith("/") else ""
        print(f"  {entry:24} {count}{format_bytes(size)}")
    print(f"on the device: tar -xzf {path.name} -C /opt && sudo /opt/edgefl-device/install.sh")
