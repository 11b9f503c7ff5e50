"""A Flower App's ServerApp and ClientApp from its run config (`[tool.flwr.app.config]`, `flwr run -c`), so a
Flower user runs an edgefl fleet with `flwr run` (examples/flower).

The config's keys: edgefl.flower.run_config.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from edgefl.flower.run_config import emulation
from edgefl.flower.simulation import RunFolder, server_app


def config_server_app(root: Optional[Path] = None):
    """A Flower App's ServerApp: it plans from the run config and writes the run folder at `output`. `root`:
    the app's folder, which a relative `devices` is read from (Flower installs an app's files where it runs
    them). Its ClientApp: `edgefl.flower.client.client_app(root=root)`, each node loading its device's share as
    the run config says."""
    from edgefl.flower.simulation import start

    def planned(context):
        spec = emulation(context.run_config, root)
        run = start(spec)
        folder = RunFolder(spec.output)
        holder.append(folder)
        return run

    holder: list[RunFolder] = []
    return server_app(planned, lambda record: holder[-1].round(record), lambda s: holder[-1].finish(s))
