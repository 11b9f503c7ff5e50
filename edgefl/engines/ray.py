"""`edgefl emulate --engine ray`: the emulated devices in a pool of Ray actors, the round loop here.

An engine because it wires the device room (the torch Trainer, EmulatedDevice) into the Ray transport,
which knows neither. What runs where:

* this process (the driver): data loading, the plan, the Coordinator, the global model, the running
  aggregate, evaluation, history.json and weights.pt, as with `--engine local`;
* each actor (the cluster's CPUs / this process's torch threads of them, or one per GPU with `--device
  cuda`): the torch Trainer, built once, and for each instruction an EmulatedDevice around that device's
  shard, which the object store holds.

Same results as `--engine local` for the same seed: a device trains with the code, seed, data rows and
instruction it would get in this process, with the intra-op thread count this process uses
(torch.get_num_threads(), i.e. OMP_NUM_THREADS; parallel float sums depend on it), and the reports are
folded in the order they were sent (edgefl.transport.ray_transport).
"""
from __future__ import annotations

import functools
import socket
import warnings
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

from edgefl.errors import ConfigError
from edgefl.transport.ray_transport import RayTransport, import_ray
from edgefl.zoo import ModelRef

# glibc's own largest dynamic mmap threshold (64-bit); its dynamic trim threshold is twice the mmap one
ALLOCATOR_MMAP_THRESHOLD = 32 * 2**20
READ_ONLY = "The given NumPy array is not writable"   # torch's warning for arrays read from the object store


class DeviceHost:
    """What one actor runs: the trainer `edgefl.engines.local` builds, and per instruction the device it
    would build, with the device's rows of the training set. The shard and the weights are numpy arrays
    read from the object store, not copied (read-only: the trainer copies weights into its model and
    gathers batches out of the shard); the report's tensors go back as numpy arrays, as over MQTT."""

    def __init__(self, ref: ModelRef, device: str, threads: int):
        import torch

        from edgefl.cost.measure import configure_allocator
        from edgefl.engines.local import torch_trainer
        torch.set_num_threads(threads)
        # A fresh worker keeps glibc's 128 KiB mmap threshold until it frees a large block, and an actor that
        # only trains small clients rarely does: each device's model copy, gradients and momentum (a few MiB)
        # are mapped and unmapped again, ~2,900 page faults per device (cnn) and a round 20% slower than
        # the same devices in the driver, which loading the data set moved to glibc's largest threshold.
        configure_allocator(ALLOCATOR_MMAP_THRESHOLD, 2 * ALLOCATOR_MMAP_THRESHOLD)
        self.trainer = torch_trainer(ref, device)

    def __call__(self, device_id: str, instruction, weights, x, y, memory_bytes: Optional[int]):
        import torch

        from edgefl.device_runtime.trainers.torch_trainer import EmulatedDevice
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", READ_ONLY)
            weights = {k: torch.from_numpy(v) for k, v in weights.items()}
        report = EmulatedDevice(device_id, self.trainer, x, y, memory_bytes=memory_bytes).handle(instruction, weights)
        report.tensors = {k: v.numpy() for k, v in report.tensors.items()}
        return report


def shard(device) -> tuple:
    """An emulated device's own rows of the training set and its memory: what its actor is given."""
    x, y = (device.x, device.y) if device.rows is None else (device.x[device.rows], device.y[device.rows])
    return x, y, device.memory_bytes


class RayEngine:
    """Connected to a Ray cluster: `engine(make_device)` is the transport `edgefl.engines.local.emulate` runs
    its devices through. `size` actors, each reserving one CPU (pool: the cluster's CPUs / the trainer's
    threads) or one GPU."""

    def __init__(self, ray, ref: ModelRef, device: str, threads: int):
        cluster = ray.cluster_resources()
        if device == "cuda":
            self.size, self.resources = int(cluster.get("GPU", 0)), {"num_gpus": 1}
        else:
            cpus = int(cluster.get("CPU", 0))
            self.size, self.resources = (max(cpus // threads, 1) if cpus else 0), {"num_cpus": 1}
        self.nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        self.host = functools.partial(DeviceHost, ref, device, threads)
        self.threads = threads
        self.made: list[RayTransport] = []

    def __call__(self, make_device: Callable) -> RayTransport:
        transport = RayTransport(self.host, lambda d: shard(make_device(d)), size=self.size, resources=self.resources)
        self.made.append(transport)
        return transport

    def describe(self) -> str:
        unit = "GPU" if "num_gpus" in self.resources else f"CPU, {self.threads} torch thread(s)"
        return f"Ray: {self.size} device actors ({unit} each) on {self.nodes} node(s)"


def check_address(address: str, timeout_s: float = 10.0) -> None:
    """Fail at once where nothing listens at HOST:PORT: ray.init retries such an address for many minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT of the Ray head (ray start --head --port PORT)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise ConfigError(f"--address {address}: no Ray cluster answers there ({exc.strerror or exc}); start one "
                          f"with 'ray start --head --port {port}' on {host}") from None


@contextmanager
def ray_engine(address: Optional[str], ref: ModelRef, device: str) -> Iterator[RayEngine]:
    """Connect to the cluster whose head is at `address` (HOST:PORT, as `ray start --head --port` printed;
    None: start a one-node Ray on this machine), and disconnect, the actors gone, when the block ends."""
    ray = import_ray()
    import torch

    if address:
        check_address(address)
    options = {"address": address} if address else {"include_dashboard": False}
    try:
        ray.init(**options, logging_level="WARNING", configure_logging=True)
    except ConnectionError as exc:
        raise ConfigError(f"--address {address}: no Ray cluster answers there ({str(exc).splitlines()[0]}); "
                          "start one with 'ray start --head --port PORT'") from None
    engine = RayEngine(ray, ref, device, torch.get_num_threads())
    try:
        with warnings.catch_warnings():   # reports' arrays are read-only: the server reads them, never writes
            warnings.filterwarnings("ignore", READ_ONLY)
            yield engine
    finally:
        for transport in engine.made:
            transport.close()
        ray.shutdown()
