"""edgefl's planners and aggregation as a Flower Strategy.

Not a second round loop: `EdgeflStrategy` runs the one `edgefl emulate` runs (`edgefl.engines.local.emulate`:
the Coordinator, the planned strategy, the torch server model and its aggregation) with Flower as its
Transport. The loop runs in a thread of its own and, each round, samples the devices, asks the method for
each one's TrainConfig, refuses those over their group's budgets and extracts each device's slice of the
global state, exactly as in `edgefl emulate`; `send` hands each (instruction, slice) to this strategy.
`configure_train` turns them into one Flower Message per device, to the node that is that device;
`aggregate_train` hands the replies back, in the order the instructions went out (the order the emulation's
devices report in, so the float sums run in the same order), and returns once edgefl has folded them into
the global model (layer-wise, width slices, low-rank: whatever the method's aggregation is) and evaluated it:
the global model as Flower's ArrayRecord and the round's metrics.

Which node is which device: before the first round, a query message asks every node which device it is: the
`device-id` of its node config (a deployed supernode), else the device at its partition id's position of the
fleet's sorted device ids (Flower's simulation; edgefl.flower.client). A device that two nodes claim, or that
no node claims, stops the run before any round, naming it.
Flower's own evaluation round is not used (edgefl evaluates the global model on the server's test split, and
each group's accuracy on its devices' data, as `edgefl emulate` does): `configure_evaluate` sends nothing.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterable, Optional

from edgefl.errors import TransportError
from edgefl.flower.client import DEVICE_ID
from edgefl.flower.records import NODE_THREADS, array_record, import_flwr, report_of, train_content
from edgefl.messages import RoundInstruction
from edgefl.transport import Transport

NODES_TIMEOUT_S = 300.0      # every node of the fleet must have joined the run and said its device within this


class FlowerRelay(Transport):
    """The round loop's Transport: what it sends waits for the strategy's `configure_train`; `collect` blocks
    until `aggregate_train` hands it the round's reports."""

    def __init__(self):
        self.outbox: list[tuple[RoundInstruction, dict]] = []
        self.to_flower: queue.Queue = queue.Queue()       # ("sent", round, outbox) | ("done", record) | ("error", exc)
        self.to_loop: queue.Queue = queue.Queue()         # a round's reports, or None: the Flower run ended

    def send(self, instruction, weights, artifacts=None) -> None:
        self.outbox.append((instruction, weights))

    def collect(self, round, expected, timeout_s, on_report=None):
        sent, self.outbox = self.outbox, []
        self.to_flower.put(("sent", round, sent))
        reports = self.to_loop.get()
        if reports is None:
            raise TransportError(f"the Flower run ended before round {round} was answered")
        for report in reports:
            if on_report is not None:
                on_report(report)
        return reports


class _Watched:
    """The method's strategy, unchanged, but for a copy of the global state after each round's aggregation
    (`after_round` sees it) and after each change the method makes to it then: what `aggregate_train` returns as
    Flower's ArrayRecord."""

    def __init__(self, strategy, seen: Callable):
        self._strategy, self._seen = strategy, seen

    def __getattr__(self, name):
        return getattr(self._strategy, name)

    def after_round(self, r, record, state, edit=None):
        self._seen(_copied(state))

        def edited(change):           # the method changed the global state (ProFL's output modules): Flower gets that
            new_state, done = edit(change)
            self._seen(_copied(new_state))
            return new_state, done
        return self._strategy.after_round(r, record, state, edit=edited if edit is not None else None)


def _copied(state) -> dict:
    return {k: v.detach().cpu().numpy().copy() for k, v in state.items()}


def _strategy_base():
    import_flwr()
    from flwr.serverapp.strategy import Strategy

    return Strategy


class EdgeflStrategy(_strategy_base()):
    """A Flower Strategy over an `EmulatedRun` (edgefl.engines.emulation: the fleet, its plan, the data and the
    run folder). `on_round(record)`: each round's RoundRecord, once edgefl evaluated it."""

    def __init__(self, run, on_round: Callable = lambda record: None, nodes_timeout_s: float = NODES_TIMEOUT_S):
        self.run, self.on_round, self.nodes_timeout_s = run, on_round, nodes_timeout_s
        self.relay = FlowerRelay()
        self.records: list = []
        self.server = None                     # edgefl's server model, once the loop ended
        self.global_state: Optional[dict] = None
        self.node_of: dict[str, int] = {}      # device -> node id
        self.sent: dict[int, dict[int, RoundInstruction]] = {}   # round -> {node id: instruction}, in send order
        # what each train message carried: round, device, group, its ArrayRecord's bytes and shapes, its config
        self.messages: list[dict] = []
        # what each reply's MetricRecord said: loss, examples, bytes, the worker process's peak RSS over the round
        self.replies: list[dict] = []
        self._loop: Optional[threading.Thread] = None
        self.group_of = {d: g for g in run.fleet.groups for d in g.device_ids}

    # -- the round loop, in its own thread
    def _start_loop(self) -> None:
        from edgefl.engines.local import emulate

        run, spec = self.run, self.run.spec

        def done(record) -> None:
            self.records.append(record)
            self.on_round(record)
            self.relay.to_flower.put(("done", record))

        def body() -> None:
            try:
                strategy = _Watched(run.strategy, lambda state: setattr(self, "global_state", state))
                _, self.server = emulate(run.fleet, run.plan, strategy, run.plan.model, run.train_set, run.test_set,
                                         run.shares, spec.settings(), spec.device, done, toa=spec.toa,
                                         initial_state=run.initial, transport=lambda make_device: self.relay)
            except BaseException as exc:     # the Flower side re-raises it
                self.relay.to_flower.put(("error", exc))

        self._loop = threading.Thread(target=body, name="edgefl-round-loop", daemon=True)
        self._loop.start()

    def _next(self, kind: str):
        got = self.relay.to_flower.get()
        if got[0] == "error":
            raise got[1]
        assert got[0] == kind, got
        return got[1:]

    # -- which node is which device
    def _map_nodes(self, grid) -> None:
        app = import_flwr()
        devices = sorted(d for g in self.run.fleet.groups for d in g.device_ids)
        deadline = time.monotonic() + self.nodes_timeout_s
        while len(nodes := list(grid.get_node_ids())) < len(devices):
            if time.monotonic() > deadline:
                raise TransportError(f"{len(nodes)} Flower nodes joined, the fleet has {len(devices)} devices: run "
                                     f"one supernode per device (--num-supernodes {len(devices)})")
            time.sleep(0.05)
        # a node's first answer waits for its ClientApp to load (torch, the data): on a busy machine some miss
        # one exchange's timeout, so the silent ones are asked again until the one deadline
        while (silent := set(nodes) - set(self.node_of.values())) and time.monotonic() < deadline:
            asks = [app.Message(app.RecordDict({"ask": app.ConfigRecord({"what": DEVICE_ID})}), dst_node_id=n,
                                message_type=app.MessageType.QUERY) for n in sorted(silent)]
            for reply in grid.send_and_receive(asks, timeout=max(1.0, min(30.0, deadline - time.monotonic()))):
                if reply.has_error():
                    raise TransportError(f"node {reply.metadata.src_node_id} did not say which device it is: "
                                         f"{reply.error.reason}")
                device = str(reply.content["node"][DEVICE_ID])
                if self.node_of.get(device, reply.metadata.src_node_id) != reply.metadata.src_node_id:
                    raise TransportError(f"Flower nodes {self.node_of[device]} and {reply.metadata.src_node_id} both "
                                         f"say they are device {device}: give each supernode its own device-id")
                self.node_of[device] = reply.metadata.src_node_id
        if set(self.node_of) != set(devices):
            raise TransportError(f"no Flower node is device {sorted(set(devices) - set(self.node_of))[:3]}")

    def _node_config(self, instruction: RoundInstruction) -> dict:
        import json

        group = self.group_of[instruction.device_id]
        return {"group": group.name, "memory-bytes": int(group.memory_budget_bytes),
                "model": json.dumps(self.run.plan.model.to_json()), "torch-device": self.run.spec.device,
                "torch-threads": NODE_THREADS}

    # -- Flower's Strategy
    def configure_train(self, server_round, arrays, config, grid) -> Iterable:
        app = import_flwr()
        if self._loop is None:
            self._map_nodes(grid)
            self._start_loop()
        r, sent = self._next("sent")
        if r != server_round:
            raise TransportError(f"Flower asked for round {server_round}, edgefl's loop is at round {r}")
        messages, self.sent[r] = [], {}
        for instruction, weights in sent:
            node = self.node_of[instruction.device_id]
            content = train_content(instruction, weights, self._node_config(instruction))
            self.messages.append(carried(instruction, content))
            self.sent[r][node] = instruction
            messages.append(app.Message(content, dst_node_id=node, message_type=app.MessageType.TRAIN))
        return messages

    def aggregate_train(self, server_round, replies):
        app = import_flwr()
        sent = self.sent.pop(server_round, {})
        by_node = {reply.metadata.src_node_id: reply for reply in replies}
        for node, instruction in sent.items():
            if node in by_node and not by_node[node].has_error():
                metrics = dict(by_node[node].content["metrics"])
                self.replies.append({"round": server_round, "device": instruction.device_id, **metrics})
        # in the order sent: the order the emulation's devices report in, so the sums run alike
        self.relay.to_loop.put([report_of(by_node[n], i) for n, i in sent.items() if n in by_node])
        (record,) = self._next("done")
        if server_round == self.run.spec.rounds and self._loop is not None:
            self._loop.join()
            if self.global_state is None and self.server is not None:
                self.global_state = self.server.snapshot()
        metrics = {k: float(v) for k, v in (("accuracy", record.accuracy), ("loss", record.loss),
                                            ("train-loss", record.train_loss)) if v is not None}
        metrics.update({"participating": sum(record.participating.values()), "failed": len(record.failed),
                        "skipped": len(record.skipped), "upload-bytes": record.upload_bytes,
                        "download-bytes": record.download_bytes})
        arrays = array_record(self.global_state) if self.global_state is not None else None
        return arrays, app.MetricRecord(metrics)

    def configure_evaluate(self, server_round, arrays, config, grid) -> Iterable:
        return []

    def aggregate_evaluate(self, server_round, replies):
        return None

    def summary(self) -> None:
        from logging import INFO

        from flwr.common.logger import log

        plan = self.run.plan
        log(INFO, f"EdgeflStrategy: {self.run.spec.method} on {plan.model.describe()}, "
              f"{sum(len(g.device_ids) for g in self.run.fleet.groups)} devices in {len(plan.groups)} groups")

    def close(self) -> None:
        """Let a loop still waiting for replies end (the Flower run stopped early)."""
        if self._loop is not None and self._loop.is_alive():
            self.relay.to_loop.put(None)


def carried(instruction: RoundInstruction, content) -> dict:
    """What one train message carries, for the run folder's flower_messages.json: its arrays' names, shapes and
    bytes (`array_bytes`: the tensors' own, what a device counts as downloaded; `record_bytes`: the ArrayRecord's
    as Flower counts it, serialisation headers included), and its config's plain values."""
    import numpy as np

    arrays = content["arrays"]
    data = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in arrays.values())
    return {"round": instruction.round, "device": instruction.device_id, "array_bytes": data,
            "record_bytes": arrays.count_bytes(),
            "arrays": {k: list(a.shape) for k, a in arrays.items()},
            "config": {k: v for k, v in content["config"].items() if k != "instruction"}}
