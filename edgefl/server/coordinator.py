"""The round loop: one loop for emulation and deployment.

Per round: sample devices, ask the strategy for each device's TrainConfig (the plan's step for its group
and round, or an online choice) and trainer options, check it fits the device's budgets, send instruction
+ extracted weights through the Transport, collect DeviceReports (a device that failed, e.g. out of
memory, is recorded and left out), place each update into the global model and fold it into the round's
running aggregate by the strategy's rule as it arrives, dropping its tensors (journaled first), so the loop
holds one upload at a time however many devices report; let the strategy look at the new global state
(`after_round`), evaluate every k rounds (globally and on each group's data), append to the History.
Tensor work is delegated to a `ServerModel` so this module stays free of torch.
"""
from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Optional, Protocol

from edgefl.errors import ReportRejected
from edgefl.fleet import Fleet
from edgefl.messages import DeviceReport, ReportStatus, RoundInstruction
from edgefl.planning.plan import Plan, violations
from edgefl.planning.strategies.base import Strategy
from edgefl.server.history import RoundRecord, record_from_json, record_to_json
from edgefl.server.runstate import RunState
from edgefl.transport import Transport
from edgefl.units import format_bytes


@dataclass
class Delivery:
    """What the server sends for one instruction: the weights, what `contribution` needs back (index
    sets), trainer options it adds (the widths of a TOA-shrunk prefix), download bytes it spared, and the
    ids of artifacts shipped ahead of the instruction, by role (deployment: the device's artifact set)."""
    weights: dict
    handle: object = None
    options: dict = field(default_factory=dict)
    saved_bytes: int = 0
    artifacts: dict = field(default_factory=dict)


class Accumulator(Protocol):
    """A round's running aggregate: each contribution is folded in as it arrives (edgefl.server.aggregate)."""
    def add(self, contribution: object) -> None: ...


class ServerModel(Protocol):
    """What the loop needs from the global model (torch lives behind this). `streams`: its aggregation
    rules fold contributions one at a time (`accumulator`, then `apply`); a server whose rule cannot gets
    the round's contributions in one list, in device order (`aggregate`)."""
    state: Mapping[str, object]   # global tensors by name: what online decisions (ProFL) read
    streams: bool
    def weights_for(self, instruction: RoundInstruction, device_seed: int) -> Delivery: ...
    def contribution(self, report: DeviceReport, instruction: RoundInstruction, handle: object) -> object: ...
    def accumulator(self, mode: str) -> Accumulator: ...      # over the current global state
    def apply(self, running: Accumulator) -> None: ...        # the global state becomes its result
    def aggregate(self, contributions: list, mode: str) -> None: ...
    def evaluate(self) -> dict: ...
    def edit(self, change: object) -> dict: ...     # a strategy's change of the global state; what was done
    def evaluate_groups(self) -> dict[str, float]: ...
    def snapshot(self) -> dict: ...                 # global tensors as numpy arrays (for checkpoints)
    def restore(self, tensors: Mapping[str, object]) -> None: ...


@dataclass
class LoopSettings:
    rounds: int
    clients_per_round: int
    seed: int = 0
    eval_every: int = 1
    # the last rounds each evaluated as well: papers score a run by its mean accuracy over its last 10 rounds
    eval_last: int = 0
    lr: float = 0.05
    lr_final: float = 0.005                   # cosine annealing over rounds, as in SLT sec. 3.1
    round_timeout_s: Optional[float] = None
    measure_memory: bool = False              # devices measure kept activations and fail over their memory
    min_reports: int = 1                      # quorum: fewer accepted reports and the round does not aggregate

    def evaluates(self, round: int) -> bool:
        """Whether the global model is evaluated after `round`: every eval_every, each of the last eval_last
        and the last."""
        return round % self.eval_every == 0 or round > self.rounds - max(self.eval_last, 1)

    def lr_at(self, round: int) -> float:
        import math
        progress = (round - 1) / max(self.rounds - 1, 1)
        return self.lr_final + 0.5 * (self.lr - self.lr_final) * (1 + math.cos(math.pi * progress))


class Coordinator:
    def __init__(self, fleet: Fleet, plan: Plan, strategy: Strategy, server: ServerModel, transport: Transport,
                 settings: LoopSettings, examples: Callable[[str], int],
                 on_round: Optional[Callable[[RoundRecord], None]] = None, state: Optional[RunState] = None,
                 online: Optional[Callable[[], Iterable[str]]] = None,
                 declared: Optional[Callable[[str], Optional[int]]] = None):
        self.fleet, self.plan, self.strategy = fleet, plan, strategy
        self.server, self.transport, self.settings = server, transport, settings
        self.examples = examples
        self.on_round = on_round
        self.state = state
        self.online = online      # devices reachable now (deployment); None: all of them (emulation)
        # the memory a device declared it grants (deployment; None: its group's budget): it would refuse a step
        # predicted above it, every round, so it is not sent one
        self.declared = declared
        self.group_of = {d: g.name for g in fleet.groups for d in g.device_ids}
        self.devices = sorted(self.group_of)
        self.history: list[RoundRecord] = []
        self._history_json: list[dict] = []     # the same, as the state's history file holds it (each converted once)

    def sample(self, round: int) -> list[str]:
        rng = random.Random(self.settings.seed * 1_000_003 + round)
        pool = self.strategy.pool(self.plan, round)
        devices = self.devices if pool is None else [d for d in self.devices if self.group_of[d] in pool]
        return sorted(rng.sample(devices, min(self.settings.clients_per_round, len(devices))))

    def resume(self) -> int:
        """Restore the last checkpoint of `state` (global tensors, strategy, history); the next round to run."""
        saved = self.state.load() if self.state is not None else None
        if saved is None:
            return 1
        last, weights, self.strategy, history = saved
        self.server.restore(weights)
        self.history = [record_from_json(d) for d in history]
        self._history_json = list(history)
        return last + 1

    def run(self, start_round: Optional[int] = None) -> list[RoundRecord]:
        """Rounds from `start_round` (default: after the last checkpoint, or 1) to settings.rounds; with a
        state folder each completed round is checkpointed before the next begins."""
        first = self.resume() if start_round is None else start_round
        if self.state is not None and (first > 1 or self.state.journaled_devices(first)):
            self.transport.resuming(first)
        for r in range(first, self.settings.rounds + 1):
            self.history.append(self.round(r))
            if self.state is not None:
                self._history_json.append(record_to_json(self.history[-1]))
                self.state.save(r, self.server.snapshot(), self.strategy, self._history_json)
            if self.on_round:
                self.on_round(self.history[-1])
        return self.history

    def round(self, r: int) -> RoundRecord:
        t0 = time.perf_counter()
        sampled = self.sample(r)
        record = RoundRecord(round=r, sampled={d: self.group_of[d] for d in sampled}, participating={})
        sent: dict[str, tuple[RoundInstruction, object]] = {}
        # reports a killed coordinator had accepted for this round: their devices are not asked again
        journaled = set(self.state.journaled_devices(r)) if self.state is not None else set()
        reachable = set(self.online()) if self.online is not None else None
        for device in sampled:
            if reachable is not None and device not in reachable and device not in journaled:
                record.skipped[device] = "offline"
                continue
            group = self.fleet.group(self.group_of[device])
            step = self.strategy.configure_round(self.plan, r, group.name)
            if step is None:
                record.skipped[device] = self.strategy.idle_reason(self.plan, r, group.name)
                continue
            bad = violations(step.predicted, group, step.config)
            mine = self.declared(device) if self.declared is not None else None
            if mine is not None and step.predicted.peak_memory_bytes > mine:
                bad.append(f"peak memory {format_bytes(step.predicted.peak_memory_bytes)} > the {format_bytes(mine)} "
                           f"its agent declared (--memory); give it --memory {format_bytes(group.memory_budget_bytes)}"
                           ", its group's budget, or plan the group for what it has")
            if bad:  # budgets are enforced, not assumed
                record.skipped[device] = "; ".join(bad)
                continue
            seed = zlib.crc32(f"{self.settings.seed}/{device}".encode()) & 0x7FFFFFFF
            options = self.strategy.trainer_options(r, step, self.plan.groups[group.name])
            # the plan's promise for this step (its constants, calibrated or not), which a device checks against
            # the memory it grants before it trains
            options["predicted_peak_bytes"] = step.predicted.peak_memory_bytes
            if group.examples is not None:   # the plan's FLOPs assume this many: a device trains no more
                options["max_examples"] = group.examples
            if self.settings.measure_memory:
                options["memory_check"] = (step.predicted.peak_memory_bytes, step.predicted.activation_bytes)
            instruction = RoundInstruction(round=r, device_id=device, config=step.config, weights_version=r - 1,
                                           seed=seed + r, lr=self.settings.lr_at(r),
                                           deadline_s=self.settings.round_timeout_s,
                                           options=tuple(sorted(options.items())), sequence=step.sequence)
            delivery = self.server.weights_for(instruction, seed)
            if delivery.options:
                instruction = replace(instruction, options=tuple(sorted({**options, **delivery.options}.items())))
            sent[device] = (instruction, delivery.handle)
            record.predicted_peak_bytes[device] = step.predicted.peak_memory_bytes
            record.download_saved_bytes += delivery.saved_bytes
            flops = step.predicted.flops_per_sample * self.examples(device) * step.config.local_epochs
            record.flops_per_device[device] = flops
            record.flops += flops
            if device not in journaled:
                self.transport.send(instruction, delivery.weights, delivery.artifacts or None)
        waiting = [d for d in sent if d not in journaled]
        intake = _Intake(record, sent, self.server, self.strategy.aggregation)

        def arrived(report: DeviceReport) -> None:
            if self.state is not None:
                self.state.journal(report)
            intake.take(report)

        for report in self.state.journaled(r) if self.state is not None and journaled else ():
            intake.take(report)
        for report in self.transport.collect(r, waiting, self.settings.round_timeout_s, arrived):
            if not intake.took(report):     # made up at the end (failed: gone offline) or held back (duplicates)
                intake.take(report)
        intake.close(self.group_of, self.settings.min_reports)
        self.strategy.after_round(r, record, self.server.state, edit=self._edit)
        if self.settings.evaluates(r):
            metrics = self.server.evaluate()
            record.accuracy, record.loss = metrics.get("accuracy"), metrics.get("loss")
            record.group_accuracy = self.server.evaluate_groups()
        record.wall_s = time.perf_counter() - t0
        return record


    def _edit(self, change: object) -> tuple[Mapping[str, object], dict]:
        done = self.server.edit(change)
        return self.server.state, done


class _Intake:
    """A round's reports, taken one at a time as they arrive: each is checked against the instruction it
    answers and recorded as rejected, failed or accepted, and an accepted update is folded into the round's
    running aggregate at once. Every report's tensors are dropped once taken (the journal has them), so the
    loop holds one upload at a time, however many devices report. `close` puts the record's devices in
    order, whatever order the transport gave, and makes the aggregate the new global model (quorum allowing).
    """

    def __init__(self, record: RoundRecord, sent: Mapping[str, tuple[RoundInstruction, object]],
                 server: ServerModel, mode: str):
        self.record, self.sent, self.server, self.mode = record, sent, server, mode
        self.running = server.accumulator(mode) if server.streams else None
        self.held: dict[str, object] = {}     # a server whose rule cannot fold one at a time: by device
        self.accepted: set[str] = set()
        self.uploads: set[tuple[str, str]] = set()   # (device, upload) taken: the same upload again is no news
        self.losses: dict[str, float] = {}
        self._taken: dict[int, DeviceReport] = {}   # by id, kept alive so ids stay unique (tensors dropped)

    def took(self, report: DeviceReport) -> bool:
        return self._taken.get(id(report)) is report

    def take(self, report: DeviceReport) -> None:
        self._taken[id(report)] = report
        if report.upload and (report.device_id, report.upload) in self.uploads:
            report.tensors = {}     # sent again after this end journaled it (a restart lost the receipt)
            return
        if report.upload:
            self.uploads.add((report.device_id, report.upload))
        record, r = self.record, self.record.round
        instruction, handle = self.sent.get(report.device_id, (None, None))
        try:
            if report.status is ReportStatus.REJECTED:   # the transport refused the upload
                raise ReportRejected(f"{report.device_id}: {report.reason}")
            if instruction is None:
                raise ReportRejected(f"{report.device_id} was not sampled in round {r}")
            if report.device_id in self.accepted:
                raise ReportRejected(f"{report.device_id}: duplicate report for round {r}")
            report.check(instruction)
            if report.activation_bytes is not None:
                record.measured_activation_bytes[report.device_id] = report.activation_bytes
            if not report.ok:  # out of memory, crashed, gone offline: the round goes on without it
                record.failed[report.device_id] = report.reason or "device failed"
                record.download_bytes += report.download_bytes
                # a process killed at its memory cap was measured up to its death: the report keeps that peak
                if report.peak_rss_bytes is not None:
                    record.measured_peak_bytes[report.device_id] = report.peak_rss_bytes
                if report.metrics:
                    record.device_metrics[report.device_id] = report.metrics
                return
            contribution = self.server.contribution(report, instruction, handle)
        except ReportRejected as exc:
            # a device may send several bad reports in a round: each reason stays
            old = record.rejected.get(report.device_id)
            record.rejected[report.device_id] = f"{old} | {exc}" if old else str(exc)
            return
        finally:
            report.tensors = {}
        if self.running is not None:
            self.running.add(contribution)
        else:
            self.held[report.device_id] = contribution
        self.accepted.add(report.device_id)
        if report.peak_rss_bytes is not None:
            record.measured_peak_bytes[report.device_id] = report.peak_rss_bytes
        record.examples[report.device_id] = report.examples
        record.upload_bytes += report.upload_bytes
        record.download_bytes += report.download_bytes
        if report.metrics:
            record.device_metrics[report.device_id] = report.metrics
        if report.loss_after is not None:
            self.losses[report.device_id] = report.loss_after

    def close(self, group_of: Mapping[str, str], min_reports: int) -> None:
        record = self.record
        self._taken.clear()
        by_devices: tuple[dict[str, Any], ...] = (record.measured_activation_bytes, record.failed, record.rejected,
                                                 record.measured_peak_bytes, record.examples, record.device_metrics)
        for by_device in by_devices:
            ordered = sorted(by_device.items())
            by_device.clear()
            by_device.update(ordered)
        for device in sorted(self.accepted):
            record.participating[group_of[device]] = record.participating.get(group_of[device], 0) + 1
        answered = self.accepted | set(record.failed) | set(record.rejected)
        record.missing = sorted(d for d in self.sent if d not in answered)
        losses = [self.losses[d] for d in sorted(self.losses)]
        record.train_loss = sum(losses) / len(losses) if losses else None
        record.aggregated = len(self.accepted) >= max(min_reports, 1)
        if record.aggregated and self.running is not None:
            self.server.apply(self.running)
        elif record.aggregated:   # in device order, so a run is reproducible over any transport
            self.server.aggregate([self.held[d] for d in sorted(self.held)], self.mode)
