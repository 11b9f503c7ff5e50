"""ServerApp: edgefl plans the fleet of the run config's `devices` and runs its round loop as a Flower Strategy."""
from pathlib import Path

from edgefl.flower.app import config_server_app

app = config_server_app(root=Path(__file__).resolve().parents[1])
