"""edgefl's devices as a Flower ClientApp: a node trains what it is sent with edgefl's own emulated device.

A node is one device of the fleet: the one its node config names (`device-id`, how a deployed supernode says
which device it is: `flower-supernode --node-config "device-id='phone-low-0'"`), else, in Flower's simulation,
the device at its `partition-id` in the fleet's sorted device order (the order `edgefl emulate` gives its data
shares in). It holds that device's share of
the training set, split as `edgefl emulate` splits it (same data set, subset, partition and seed), loaded
once per worker process. A train message is answered as the emulation's device answers the same
instruction: `EmulatedDevice.handle` with the torch trainer of `edgefl.engines.local`, the device held to its
memory (with `memory_check`, the measured activations in the predicted peak: over it, the round fails as an
out-of-memory kill would). The reply adds the worker process's peak RSS over the round (VmHWM, reset before
training; the process's, runtime and data included, not the device's budgeted training memory).

A deployed node trains on its own examples when its node config names them (`data`: a folder with x.npy and
y.npy, or an .npz, as `edgefl data export` writes a device's share and `edgefl-device --data` reads it:
`--node-config "device-id='phone-low-0' data='/data/edgefl'"`): read once per worker process, checked as a
device checks its data (numbers, labels of the model's classes, the model's input shape per example), every
example trained on. Without `data` a node trains on its device's share of the data set as `edgefl emulate`
splits it, which loads the whole training set in each worker.

A query message is answered with the node's device id (and partition id, where it has one): how the server maps
nodes to the fleet's devices, and so to their groups and budgets.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgefl.errors import ConfigError
from edgefl.flower.records import import_flwr, instruction_of, reply_content

PARTITION_ID = "partition-id"
DEVICE_ID = "device-id"
DATA = "data"               # a node's own examples (module doc)


@dataclass(frozen=True)
class NodeData:
    """Where a node's examples come from: what `edgefl emulate` splits its training set by."""
    devices: str
    dataset: str
    partition: str = "iid"
    seed: int = 0
    train_limit: Optional[int] = None
    data_root: Optional[str] = None
    pretrained: Optional[str] = None

    @classmethod
    def of(cls, spec) -> "NodeData":
        """From an Emulation (edgefl.engines.emulation)."""
        path = lambda p: None if p is None else str(p)
        return cls(str(spec.devices), spec.dataset, spec.partition, spec.seed, spec.train_limit,
                   path(spec.data_root), path(spec.pretrained))


@functools.lru_cache(maxsize=2)
def _shares(data: NodeData):
    """(training set, sorted device ids, {device: rows}), as EmulatedRun.start makes them."""
    from edgefl.data import load_split
    from edgefl.data.shares import device_shares
    from edgefl.fleet import load_fleet

    options = {}
    if data.pretrained is not None:
        from edgefl.zoo.pretrained import fine_tuning_data_options

        options = fine_tuning_data_options(Path(data.pretrained), data.dataset)
    fleet = load_fleet(Path(data.devices))
    train = load_split(data.dataset, "train", data.data_root, data.train_limit, data.seed, **options)
    share_of = device_shares(fleet, train, data.partition, data.seed, source=data.dataset)
    return train, sorted(share_of), share_of


@functools.lru_cache(maxsize=2)
def _devices(devices: str) -> tuple[str, ...]:
    """The fleet's device ids in the order `edgefl emulate` gives them their shares (no data loaded)."""
    from edgefl.fleet import load_fleet

    return tuple(sorted(d for g in load_fleet(Path(devices)).groups for d in g.device_ids))


@functools.lru_cache(maxsize=2)
def _local_examples(folder: str, model_json: str):
    """(x, y) of a node's own data, checked against the model it trains (module doc)."""
    import json

    import numpy as np

    from edgefl.device_runtime.local_data import check_values, open_local_data
    from edgefl.zoo import ModelRef, build

    model = build(ModelRef.from_json(json.loads(model_json)))
    where = f"node config {DATA}={folder!r}"
    try:
        x, y = open_local_data(Path(folder))
        check_values(x, y, model.num_classes)
    except ConfigError as exc:      # said of the device's --data: here the node config names the folder
        raise ConfigError(f"{where}: {str(exc).removeprefix(f'--data {folder}: ')}") from None
    if tuple(x.shape[1:]) != tuple(model.input_shape):
        raise ConfigError(f"{where}: examples of shape {tuple(x.shape[1:])}, the model takes "
                          f"{tuple(model.input_shape)}; export this node's data for the model ('edgefl data export')")
    return np.asarray(x[:]), np.asarray(y[:], np.int64)


@functools.lru_cache(maxsize=4)
def _trainer(model_json: str, device: str, threads: int):
    import json

    import torch

    from edgefl.engines.local import torch_trainer
    from edgefl.zoo import ModelRef

    torch.set_num_threads(threads)      # the strategy's count (records.NODE_THREADS): float sums depend on it
    return torch_trainer(ModelRef.from_json(json.loads(model_json)), device)


def device_of(data: NodeData, partition_id: int) -> str:
    devices = _devices(data.devices)
    if not 0 <= partition_id < len(devices):
        raise ConfigError(f"node with partition-id {partition_id}: the fleet {data.devices} has {len(devices)} "
                          f"devices; run {len(devices)} supernodes")
    return devices[partition_id]


def node_device(data: NodeData, node_config) -> str:
    """The fleet device a node is (module doc), or ConfigError naming the node config key and the fix."""
    devices = _devices(data.devices)
    if DEVICE_ID in node_config:
        device = str(node_config[DEVICE_ID])
        if device not in devices:
            raise ConfigError(f"node config {DEVICE_ID}={device!r}: not a device of the fleet {data.devices}; start "
                              f"the supernode with one of its ids ({', '.join(devices[:3])}, ...)")
        return device
    if PARTITION_ID in node_config:
        return device_of(data, int(node_config[PARTITION_ID]))
    raise ConfigError(f"a node config with neither {DEVICE_ID} nor {PARTITION_ID}: start each supernode with "
                      f"--node-config \"{DEVICE_ID}='<its fleet device id>'\"")


def train(data: NodeData, node_config, content):
    """The reply content for one train message's `content`."""
    import torch

    from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice

    instruction = instruction_of(content)
    config = content["config"]
    device_id = node_device(data, node_config)
    if device_id != instruction.device_id:
        raise ConfigError(f"node {device_id} was sent {instruction.device_id}'s instruction")
    if DATA in node_config:
        (x, y), rows = _local_examples(str(node_config[DATA]), config["model"]), None
    else:
        train_set, _, share_of = _shares(data)
        x, y, rows = train_set.x, train_set.y, share_of[device_id]
    trainer = _trainer(config["model"], config["torch-device"], int(config["torch-threads"]))
    weights = {k: torch.from_numpy(a.numpy()) for k, a in content["arrays"].items()}
    _reset_peak()
    report = EmulatedDevice(device_id, trainer, x, y, memory_bytes=int(config["memory-bytes"]),
                            rows=rows).handle(instruction, weights)
    peak = _peak_rss()
    report.tensors = {k: v.detach().cpu().numpy() for k, v in report.tensors.items()}
    return reply_content(report, peak)


def client_app(data: Optional[NodeData] = None, root: Optional[Path] = None):
    """The ClientApp. `data`: where nodes' examples come from (None: the run config's keys, see
    edgefl.flower.run_config, a relative `devices` read from `root`)."""
    from flwr.clientapp import ClientApp

    app_ = import_flwr()
    app = ClientApp()

    def data_of(context) -> NodeData:
        if data is not None:
            return data
        from edgefl.flower.run_config import emulation

        return NodeData.of(emulation(context.run_config, root))

    @app.query()
    def query(msg, context):
        said = {DEVICE_ID: node_device(data_of(context), context.node_config)}
        if PARTITION_ID in context.node_config:
            said[PARTITION_ID] = int(context.node_config[PARTITION_ID])
        return app_.Message(app_.RecordDict({"node": app_.ConfigRecord(said)}), reply_to=msg)

    @app.train()
    def train_(msg, context):
        return app_.Message(train(data_of(context), context.node_config, msg.content), reply_to=msg)

    return app


def _reset_peak() -> None:
    """VmHWM back to the current RSS (Linux: clear_refs 5); elsewhere the peak is the process's lifetime one."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _peak_rss() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.Process().memory_info().rss
