"""ClientApp: each node is one device of the fleet, training the slice it is sent within its group's budget."""
from edgefl.flower.client import client_app

app = client_app()
