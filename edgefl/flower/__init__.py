"""edgefl inside Flower (pip install 'edgefl[flower]'): the planners and aggregation as a Flower Strategy, the
devices as a Flower ClientApp, a fleet as a Flower simulation (`edgefl flower`).

`EdgeflStrategy` (strategy) runs edgefl's round loop with Flower as its transport; `client_app` (client) trains
what a node is sent as an emulated device, held to its memory; `simulate` (simulation) runs both in Flower's
simulation runtime and writes a run folder `edgefl report` reads; `app` builds both from a Flower app's run
config (examples/flower). Only this room imports flwr, and only when one of these names is used.
"""
from edgefl import lazy_exports

_WHERE = {
    "EdgeflStrategy": ".strategy", "FlowerRelay": ".strategy", "client_app": ".client", "NodeData": ".client",
    "server_app": ".simulation", "simulate": ".simulation", "flower": ".simulation", "RunFolder": ".simulation",
    "config_server_app": ".app",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
