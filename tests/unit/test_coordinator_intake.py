"""The coordinator folds each report into the round's aggregate as the transport hands it over and drops
its tensors at once: it holds one upload at a time, and the order reports arrive in changes neither the
round's record nor (beyond one float32 ulp) the new global model."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

from edgefl.engines.local import torch_trainer
from edgefl.fleet import parse_fleet
from edgefl.messages import DeviceReport
from edgefl.planning.plan import verify
from edgefl.planning.strategies import PlanContext, get_strategy
from edgefl.server.coordinator import Coordinator, LoopSettings
from edgefl.server.global_model import TorchServerModel
from edgefl.server.history import record_to_json
from edgefl.transport import Transport
from edgefl.zoo import ModelRef

pytestmark = pytest.mark.usefixtures("one_thread")

CNN = ModelRef.of("cnn", num_classes=10, input_shape=(1, 28, 28))
FLEET = "fleet:\n  groups:\n    a: {count: 3, memory_budget: 8GiB, runtime: torch}\n" \
        "    b: {count: 3, memory_budget: 8GiB, runtime: torch}\n"


class ScriptedTransport(Transport):
    """Devices answer with the weights they got plus a per-device offset; `collect` hands the reports over
    one by one in `order`, making each only when it is due (as a network would), and records how many
    earlier uploads were still alive at that moment. Like a real transport it keeps every report object
    until `collect` returns."""

    def __init__(self, order=sorted, extra=()):
        self.order, self.extra = order, list(extra)
        self.sent, self.alive_at_arrival, self._uploads = {}, [], []

    def send(self, instruction, weights, artifacts=None):
        self.sent[instruction.device_id] = (instruction, {k: v.numpy().copy() for k, v in weights.items()})

    def report(self, device):
        instruction, weights = self.sent[device]
        offset = 1 + int(device.rsplit("-", 1)[-1])
        tensors = {k: v + np.float32(0.01 * offset) for k, v in weights.items()}
        self._uploads += [weakref.ref(t) for t in tensors.values()]
        return DeviceReport(round=instruction.round, device_id=device, config_hash=instruction.config_hash,
                            status="ok", examples=10 * offset, tensors=tensors, loss_after=0.1 * offset,
                            upload_bytes=sum(t.nbytes for t in tensors.values()))

    def collect(self, round, expected, timeout_s, on_report=None):
        reports = []
        for device in self.order(list(expected)):
            gc.collect()
            self.alive_at_arrival.append(sum(ref() is not None for ref in self._uploads))
            reports.append(self.report(device))
            on_report(reports[-1])
        return reports + [self.report(d) for d in self.extra]   # held back to the end: a second report


def run(transport, rounds=1):
    fleet = parse_fleet(FLEET)
    strategy = get_strategy("fedavg")
    plan = verify(strategy.plan(PlanContext(fleet, CNN, rounds=rounds, batch_size=32)), fleet)
    server = TorchServerModel(CNN, None, torch_trainer(CNN), seed=0)
    settings = LoopSettings(rounds=rounds, clients_per_round=5, seed=0)
    coordinator = Coordinator(fleet, plan, strategy, server, transport, settings, examples=lambda d: 10)
    return coordinator.run(), server


def test_the_coordinator_holds_one_upload_at_a_time():
    transport = ScriptedTransport()

    records, _ = run(transport)

    assert sum(records[0].participating.values()) == 5
    # when each report arrives, every earlier upload is gone: folded and dropped
    assert transport.alive_at_arrival == [0] * 5


def test_arrival_order_changes_neither_the_record_nor_the_model_beyond_one_ulp():
    in_order, reference = run(ScriptedTransport(order=sorted, extra=["a-1"]))
    reversed_, shuffled = run(ScriptedTransport(order=lambda ds: sorted(ds)[::-1], extra=["a-1"]))

    strip = [{k: v for k, v in record_to_json(r).items() if k != "wall_s"} for r in (in_order[0], reversed_[0])]
    assert list(strip[0]["examples"]) == sorted(strip[0]["examples"])      # devices in order, as before
    assert strip[0] == strip[1] and list(strip[0]["examples"]) == list(strip[1]["examples"])
    assert "duplicate report" in in_order[0].rejected["a-1"]
    for key, value in reference.state.items():
        inf = torch.full_like(value, float("inf"))
        other = shuffled.state[key]
        assert bool(((other >= torch.nextafter(value, -inf)) & (other <= torch.nextafter(value, inf))).all())
