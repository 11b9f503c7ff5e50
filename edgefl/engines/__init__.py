"""Engines: where a run's devices live, behind the one round loop (edgefl.server.coordinator).

`local` (in this process: torch devices over the in-memory transport), `ray` (in the actors of a Ray
cluster), `deployed` (real devices over MQTT, sent exported artifact sets); the runs that drive them end to
end: `emulation` (`edgefl emulate`), `serving` (`edgefl serve`), `agents` (a fleet of real device agents on
this machine: `edgefl fleet up`). Only this room and the CLI wire export, device_runtime and the concrete
transports into the server.
"""
from edgefl import lazy_exports

_WHERE = {
    "emulate": ".local", "torch_trainer": ".local",
    "Emulation": ".emulation", "EmulatedRun": ".emulation",
    "Serving": ".serving", "serve": ".serving",
    "DeployedServerModel": ".deployed", "ArtifactShipper": ".deployed", "fleet_of": ".deployed",
    "check_deployable": ".deployed",
    "ray_engine": ".ray", "Agents": ".agents",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
