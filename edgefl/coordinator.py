"""The round loop: one loop for emulation and deployment.

Per round: sample devices, ask the strategy for each device's TrainConfig (the plan's step for its group
and round), check it fits the device's budgets, send instruction + extracted weights through the
Transport, collect DeviceReports, place each update into the global model and aggregate with the
strategy's rule, evaluate every k rounds, append to the History. Tensor work is delegated to a
`ServerModel` so this module stays free of torch.
"""
from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

from edgefl.errors import ReportRejected
from edgefl.fleet import Fleet
from edgefl.messages import DeviceReport, RoundInstruction
from edgefl.plan import Plan, violations
from edgefl.strategies.base import Strategy
from edgefl.trainconfig import TrainConfig
from edgefl.transport import Transport


class ServerModel(Protocol):
    """What the loop needs from the global model (torch lives behind this)."""
    def weights_for(self, config: TrainConfig, round: int, device_seed: int) -> tuple[dict, object]: ...
    def contribution(self, report: DeviceReport, config: TrainConfig, indices: object) -> object: ...
    def aggregate(self, contributions: list, mode: str) -> None: ...
    def evaluate(self) -> dict: ...


@dataclass
class RoundRecord:
    round: int
    sampled: dict[str, str]                       # device -> group
    participating: dict[str, int]                 # group -> devices that reported
    skipped: dict[str, str] = field(default_factory=dict)     # device -> why it did not train
    rejected: dict[str, str] = field(default_factory=dict)    # device -> why its report was dropped
    predicted_peak_bytes: dict[str, int] = field(default_factory=dict)
    measured_activation_bytes: dict[str, int] = field(default_factory=dict)
    upload_bytes: int = 0
    download_bytes: int = 0
    flops: float = 0.0
    train_loss: Optional[float] = None
    accuracy: Optional[float] = None
    loss: Optional[float] = None
    group_accuracy: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0


@dataclass
class LoopSettings:
    rounds: int
    clients_per_round: int
    seed: int = 0
    eval_every: int = 1
    lr: float = 0.05
    lr_final: float = 0.005                   # cosine annealing over rounds, as in SLT sec. 3.1
    round_timeout_s: Optional[float] = None

    def lr_at(self, round: int) -> float:
        import math
        progress = (round - 1) / max(self.rounds - 1, 1)
        return self.lr_final + 0.5 * (self.lr - self.lr_final) * (1 + math.cos(math.pi * progress))


class Coordinator:
    def __init__(self, fleet: Fleet, plan: Plan, strategy: Strategy, server: ServerModel, transport: Transport,
                 settings: LoopSettings, examples: Callable[[str], int],
                 on_round: Optional[Callable[[RoundRecord], None]] = None):
        self.fleet, self.plan, self.strategy = fleet, plan, strategy
        self.server, self.transport, self.settings = server, transport, settings
        self.examples = examples
        self.on_round = on_round
        self.group_of = {d: g.name for g in fleet.groups for d in g.device_ids}
        self.devices = sorted(self.group_of)
        self.history: list[RoundRecord] = []

    def sample(self, round: int) -> list[str]:
        rng = random.Random(self.settings.seed * 1_000_003 + round)
        k = min(self.settings.clients_per_round, len(self.devices))
        return sorted(rng.sample(self.devices, k))

    def run(self, start_round: int = 1) -> list[RoundRecord]:
        for r in range(start_round, self.settings.rounds + 1):
            self.history.append(self.round(r))
            if self.on_round:
                self.on_round(self.history[-1])
        return self.history

    def round(self, r: int) -> RoundRecord:
        t0 = time.perf_counter()
        sampled = self.sample(r)
        record = RoundRecord(round=r, sampled={d: self.group_of[d] for d in sampled}, participating={})
        sent: dict[str, tuple[RoundInstruction, object]] = {}
        for device in sampled:
            group = self.fleet.group(self.group_of[device])
            step = self.strategy.configure_round(self.plan, r, group.name)
            if step is None:
                record.skipped[device] = "no configuration of this method fits its group this round"
                continue
            bad = violations(step.predicted, group, step.config)
            if bad:  # budgets are enforced, not assumed
                record.skipped[device] = "; ".join(bad)
                continue
            seed = zlib.crc32(f"{self.settings.seed}/{device}".encode()) & 0x7FFFFFFF
            weights, indices = self.server.weights_for(step.config, r, seed)
            instruction = RoundInstruction(round=r, device_id=device, config=step.config, weights_version=r - 1,
                                           seed=seed + r, lr=self.settings.lr_at(r),
                                           deadline_s=self.settings.round_timeout_s,
                                           options=tuple(sorted(self.strategy.trainer_options(r, step).items())))
            sent[device] = (instruction, indices)
            record.predicted_peak_bytes[device] = step.predicted.peak_memory_bytes
            record.flops += step.predicted.flops_per_sample * self.examples(device) * step.config.local_epochs
            self.transport.send(instruction, weights)
        reports = self.transport.collect(r, sent, self.settings.round_timeout_s)
        contributions, losses = [], []
        for report in reports:
            instruction, indices = sent.get(report.device_id, (None, None))
            try:
                if instruction is None:
                    raise ReportRejected(f"{report.device_id} was not sampled in round {r}")
                report.check(instruction)
                if not report.ok:
                    raise ReportRejected(report.reason or "device failed")
            except ReportRejected as exc:
                record.rejected[report.device_id] = str(exc)
                continue
            contributions.append(self.server.contribution(report, instruction.config, indices))
            group = self.group_of[report.device_id]
            record.participating[group] = record.participating.get(group, 0) + 1
            record.upload_bytes += report.upload_bytes
            record.download_bytes += report.download_bytes
            if report.activation_bytes is not None:
                record.measured_activation_bytes[report.device_id] = report.activation_bytes
            if report.loss_after is not None:
                losses.append(report.loss_after)
        if contributions:
            self.server.aggregate(contributions, self.strategy.aggregation)
        self.strategy.after_round(r, record)
        record.train_loss = sum(losses) / len(losses) if losses else None
        if r % self.settings.eval_every == 0 or r == self.settings.rounds:
            metrics = self.server.evaluate()
            record.accuracy, record.loss = metrics.get("accuracy"), metrics.get("loss")
        record.wall_s = time.perf_counter() - t0
        return record
