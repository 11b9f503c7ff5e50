"""ClientApp: each node is one device of the fleet, training the slice it is sent within its group's budget."""
from pathlib import Path

from edgefl.flower.client import client_app

app = client_app(root=Path(__file__).resolve().parents[1])
