"""Devices in a pool of Ray actors (`edgefl emulate --engine ray`): the round loop's Transport, with the
devices on the machines of a Ray cluster instead of in this process.

Not a second system: the Coordinator sends each instruction and its weights through `send` and gets the
reports back through `collect`, as with the in-memory transport; only where a device's `handle` runs
changes. Each actor runs `host()` once (e.g. builds the torch Trainer) and then serves any device it is
given. A device's data (`data(device_id)`: its shard of the training set and small values) is put in Ray's
object store once, on its first instruction, and passed by reference after that: an actor on the same node
reads the arrays without a copy, another node fetches them once. A device stays on the actor it was first
given to (the one holding the fewest devices), so each shard lives on one node. Weights go as numpy
arrays (serialised without a copy), and a round's devices that get the same bytes (FedAvg: all of them)
share one object: the store holds each distinct set of weights once per round, not once per device.

`send` queues the work and returns at once; an actor's queue goes out as one task when it holds
DEVICES_PER_TASK devices (or when the round is collected): a task's fixed cost (scheduling, a result object,
a round trip) is shared by that many devices instead of paid by each, and this process holds at most that
many reports per actor at a time. `collect` hands the reports to `on_report` in the order the
instructions were sent, each as soon as it and the ones before it are done. The running aggregate folds
in that order, as it folds the in-process engine's reports, so both engines give the same bits
(edgefl.server.aggregate: the order of a float64 sum can move a float32 result's last bit); a report finished out
of turn waits in the object store, not in this process.

Ray is imported only here, and only when such a transport is made (`import_ray`).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Mapping, Optional

import numpy as np

from edgefl.errors import ConfigError, TransportError
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.protocol.tensors import as_array
from edgefl.transport import Transport

INSTALL_HINT = "pip install 'edgefl[ray]'"
DEVICES_PER_TASK = 8        # per-task cost shared by this many devices; reports held here: this many per actor
READY_TIMEOUT_S = 300.0     # actors must start within this (a worker process per actor, torch imported)


def import_ray():
    """The ray module, or a ConfigError with the install hint."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--engine ray: Ray is not installed here; {INSTALL_HINT}") from None
    return ray


class _Actor:
    """The body of one pool actor: `host()` made once, then one call per instruction."""

    def __init__(self, host: Callable[[], Callable[..., DeviceReport]]):
        self.serve = host()

    def ready(self) -> bool:
        return True

    def handle(self, batch: list[tuple]) -> list[DeviceReport]:
        """(device_id, instruction, weights ref, data) per device. Refs inside a list are not resolved by
        Ray: each is read here, from the object store of this node (numpy arrays without a copy)."""
        import ray
        refs = list({r: None for _, _, weights, data in batch for r in (weights, *data)
                     if isinstance(r, ray.ObjectRef)})
        value = dict(zip(refs, ray.get(refs)))         # one read for the batch; a round's shared weights once
        return [self.serve(device_id, instruction, value[weights],
                           *(value[v] if isinstance(v, ray.ObjectRef) else v for v in data))
                for device_id, instruction, weights, data in batch]


class RayTransport(Transport):
    """`size` actors, each reserving `resources` (e.g. {"num_cpus": 1} or {"num_gpus": 1}), spread over the
    cluster's nodes; `ray.init` must have been called. `host` (picklable) runs once per actor and returns
    `serve(device_id, instruction, weights, *data) -> DeviceReport`, the weights as read-only numpy arrays;
    `data(device_id)` (called here) gives the device's extra arguments, its numpy arrays put in the object
    store once and read there."""

    def __init__(self, host: Callable[[], Callable[..., DeviceReport]], data: Callable[[str], tuple], *,
                 size: int, resources: Mapping[str, float]):
        self.ray = ray = import_ray()
        if size < 1:
            raise ConfigError("--engine ray: the Ray cluster has no room for a device actor "
                              f"(each needs {dict(resources)}); add nodes or resources")
        actor = ray.remote(**resources, scheduling_strategy="SPREAD")(_Actor)
        self._actors = [actor.remote(host) for _ in range(size)]
        self._data = data
        self._placed: dict[str, tuple[int, list]] = {}      # device -> (actor index, object refs of its data)
        self._load = [0] * size                             # devices placed on each actor
        self._open: dict[int, _Task] = {}                   # actor index -> its task being filled
        self._pending: dict[int, list[tuple[str, _Task, int]]] = {}  # round -> (device, task, slot), in send order
        self._sent: tuple[int, dict] = (0, {})              # (round, {fingerprint: [(arrays, ref)]}) put so far
        try:
            ray.get([a.ready.remote() for a in self._actors], timeout=READY_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.close()
            raise TransportError(f"--engine ray: {size} device actors did not start within {READY_TIMEOUT_S:.0f} s "
                                 f"(each needs {dict(resources)}; see 'ray status')") from None
        except ray.exceptions.RayActorError as exc:
            self.close()
            raise TransportError(f"--engine ray: a device actor failed to start (every node needs this edgefl "
                                 f"version with torch): {str(exc).strip().splitlines()[-1]}") from None

    def _place(self, device_id: str) -> tuple[int, list]:
        if device_id not in self._placed:
            i = min(range(len(self._actors)), key=lambda k: self._load[k])
            self._load[i] += 1
            self._placed[device_id] = (i, [self.ray.put(v) if isinstance(v, np.ndarray) else v
                                           for v in self._data(device_id)])
        return self._placed[device_id]

    def _weights(self, round: int, weights: Mapping[str, Any]):
        """The object holding `weights` as numpy arrays: one put per distinct set of bytes in a round."""
        arrays = {k: as_array(v) for k, v in weights.items()}
        if self._sent[0] != round:
            self._sent = (round, {})
        seen = self._sent[1].setdefault(_fingerprint(arrays), [])
        for known, ref in seen:
            if all(_same(known[k], a) for k, a in arrays.items()):
                return ref
        seen.append((arrays, self.ray.put(arrays)))
        return seen[-1][1]

    def send(self, instruction: RoundInstruction, weights: Mapping[str, Any],
             artifacts: Optional[Mapping[str, str]] = None) -> None:
        i, data = self._place(instruction.device_id)
        weights = self._weights(instruction.round, weights)
        task = self._open.get(i)
        if task is not None and task.round != instruction.round:
            self._submit(i)
        task = self._open.setdefault(i, _Task(instruction.round))
        task.batch.append((instruction.device_id, instruction, weights, data))
        self._pending.setdefault(instruction.round, []).append((instruction.device_id, task, len(task.batch) - 1))
        if len(task.batch) >= DEVICES_PER_TASK:
            self._submit(i)

    def _submit(self, i: int) -> None:
        task = self._open.pop(i)
        task.ref, task.batch = self._actors[i].handle.remote(task.batch), None

    def collect(self, round: int, expected: Iterable[str], timeout_s: float | None,
                on_report: Optional[Callable[[DeviceReport], None]] = None) -> list[DeviceReport]:
        ray, queue = self.ray, self._pending.pop(round, [])
        for i in [i for i, task in self._open.items() if task.round == round]:
            self._submit(i)
        queue.reverse()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        reports = []
        while queue:
            device_id, task, slot = queue.pop()
            if task.reports is None and not task.missing:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not ray.wait([task.ref], timeout=left)[0]:   # past the deadline: its devices are missing
                    ray.cancel(task.ref)
                    task.missing = True
                else:
                    try:
                        task.reports = ray.get(task.ref)
                    except ray.exceptions.RayActorError as exc:
                        raise TransportError(f"--engine ray: the actor running device {device_id} died (a node "
                                             f"left the cluster or ran out of memory): "
                                             f"{str(exc).splitlines()[0]}") from None
                task.ref = None                  # the result object is freed once read
            if task.missing:
                continue                         # the loop records it as missing
            report, task.reports[slot] = task.reports[slot], None     # each report let go once handed on
            reports.append(report)
            if on_report is not None:
                on_report(report)
        return reports

    def close(self) -> None:
        for a in self._actors:
            self.ray.kill(a)
        self._actors, self._open, self._pending, self._sent = [], {}, {}, (0, {})


class _Task:
    """One actor call for up to DEVICES_PER_TASK devices of a round: filled, submitted, read."""

    def __init__(self, round: int):
        self.round = round
        self.batch: Optional[list[tuple]] = []
        self.ref: Any = None
        self.reports: Optional[list[Optional[DeviceReport]]] = None
        self.missing = False


def _fingerprint(arrays: Mapping[str, np.ndarray]) -> tuple:
    """Names, shapes, dtypes and 64 sampled entries per tensor: equal for equal weights, and for different
    weights of one shape (random index sets) almost never, so `_same` runs about once per device."""
    return tuple((k, a.shape, a.dtype.str, a.reshape(-1)[:: max(1, a.size // 64)].tobytes())
                 for k, a in arrays.items())


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit (-0.0 is not 0.0, a NaN equals its copy)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = (np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in (a, b))
    word = next(w for w in (np.uint64, np.uint32, np.uint8) if a.size % np.dtype(w).itemsize == 0)
    return np.array_equal(a.view(word), b.view(word))     # compared as words: 2-3x faster than as bytes
