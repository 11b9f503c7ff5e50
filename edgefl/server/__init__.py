"""The server: one round loop for emulation and deployment, and the tensor work behind it.

`coordinator` (the round loop: sample, configure, send, collect, aggregate, evaluate), `history` (a run's
RoundRecords, history.json), `runstate` (checkpoints and the journal a restarted coordinator resumes from),
`global_model` (the global weights in torch: slices, updates, evaluation), `aggregate` (a round's running
aggregate), `submodel` (the only code that slices or places tensors), `lowrank` (LoRA and FedHM factors),
`toa` (FedOLF's shrunk prefix downloads), `validate` (checks on uploads).
"""
from edgefl import lazy_exports

_WHERE = {
    "Coordinator": ".coordinator", "LoopSettings": ".coordinator", "Delivery": ".coordinator",
    "ServerModel": ".coordinator",
    "RoundRecord": ".history", "record_to_json": ".history", "record_from_json": ".history",
    "write_history": ".history", "RunState": ".runstate", "TorchServerModel": ".global_model",
    "RunningAggregate": ".aggregate", "IndexSets": ".submodel", "index_sets": ".submodel", "extract": ".submodel",
    "embed": ".submodel",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
