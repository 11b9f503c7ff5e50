"""The device agent: wait for instructions, fetch what they need, train, report what it really used.

For every instruction:
  1. refuse it, with the reason, when its predicted peak memory exceeds the memory this device grants (the
     coordinator should never send one; a device does not trust that it did not): the memory it declared
     (`--memory`), else its fleet group's budget, which the coordinator sends with every instruction (the
     budget the plan fits), else its hardware profile's default;
  2. fetch the artifact set (`DeviceLink.fetch_artifact`: only files the sha256 cache lacks travel, every
     one verified; a frozen prefix is fetched once per weights version), and check the local data against
     it (per-example shape, dtype, targets per example, labels within its classes): data it cannot take
     fails the round with the one-line reason before any trainer starts;
  3. train it in a fresh child process (`edgefl.device_runtime.worker` through `child.run_child`, or for
     ExecuTorch sets the native trainer `edgefl-et-train`, which needs neither Python nor torch), so the
     peak RSS measured (the child's VmHWM; the kernel's ru_maxrss as well) is the training's own, with an
     energy meter around it (RAPL / INA219 / battery gauge where present, else the profile's power x time,
     flagged estimated);
  4. report: trained tensors (flat float32 buffer in manifest order), example count, first/last step loss,
     peak RSS, wall time, energy with its source; the link adds the bytes it moved down and up.

A failure of one round (an artifact that fails verification, a crashed or killed training process) is
reported as a failed round with its reason; the agent keeps serving. Work of a round the coordinator has
moved past (a newer instruction came, or the round closed) is dropped, unreported: nobody would take it. An
instruction this device has answered already (a restarted coordinator sent it again before the answer's
receipt) is answered with that answer again, not trained twice. After each round the artifact cache is cut to
its budget, keeping the set just trained; its size goes into the report. On `stop` (SIGTERM) a fetch ends at
once and a training process is killed: the agent exits within seconds.
"""
from __future__ import annotations

import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from edgefl.device_runtime.child import run_child, run_process
from edgefl.device_runtime.fetch import FetchEnded
from edgefl.device_runtime.local_data import ModelInput, check_labels, check_layout, open_local_data
from edgefl.device_runtime.memcap import MemoryCap
from edgefl.device_runtime.native import choose, trainer_argv
from edgefl.device_runtime.peaks import vm_status
from edgefl.errors import ConfigError, EdgeflError
from edgefl.manifest import ArtifactSet
from edgefl.messages import DeviceReport, ReportStatus
from edgefl.protocol.envelopes import Assignment, Unreadable

SET_ROLE = "set"   # the artifact role naming a suffix set (its manifest's id) in an instruction


def settle_peak(report: DeviceReport) -> None:
    """The agent's peak taken again once the round's upload is out, so that it counts the upload's copies (taken
    when training ended, it missed them: each round reported the last one's), and the whole device's with it. A
    report of a round that started no training has no peaks to settle."""
    if "child_peak_bytes" in report.metrics:
        report.metrics["agent_peak_bytes"] = agent = vm_status("VmHWM")
        report.peak_rss_bytes = report.metrics["child_peak_bytes"] + agent


class DeviceAgent:
    def __init__(self, link, device_id: str, data: Path, runtime: str, *, memory_bytes: Optional[int] = None,
                 profile_memory_bytes: Optional[int] = None, meter: Optional[Callable[[], Any]] = None,
                 threads: int = 1, fetch_timeout_s: float = 600.0, train_timeout_s: Optional[float] = None,
                 enforce_memory: bool = False, trainer: str = "auto", log: Callable[[str], None] = lambda line: None):
        """`meter()`: a fresh energy meter (start/stop -> reading with to_json()); `memory_bytes`: the peak
        training memory this device declares it grants (`--memory`), else its group's budget from each
        instruction, else `profile_memory_bytes` (`memory_for`): instructions predicted above it are refused,
        and with `enforce_memory` the training process is also killed if it goes over, as an OOM killer would;
        `trainer`: auto | native | python (edgefl.device_runtime.native.choose)."""
        if enforce_memory and memory_bytes is None and profile_memory_bytes is None:
            raise ConfigError("--enforce-memory needs the device's memory (--memory or a --profile)")
        self.enforce_memory = enforce_memory
        self.link, self.device_id, self.data, self.runtime = link, device_id, Path(data), runtime
        self.memory_bytes, self.meter, self.threads = memory_bytes, meter, threads
        self.profile_memory_bytes = profile_memory_bytes
        self.fetch_timeout_s, self.train_timeout_s, self.log = fetch_timeout_s, train_timeout_s, log
        self.native = choose(runtime, trainer)
        self.rounds_done = 0
        self.stop = threading.Event()

    def profile(self, extra: Optional[dict] = None) -> dict:
        """What the device announces: the coordinator's view of who is online with what."""
        import psutil

        from edgefl.device_runtime.info import device_info

        info = device_info()
        # memory_bytes: what it declared (None: each round, its group's budget; the profile's without one)
        return {"runtime": self.runtime, "memory_bytes": self.memory_bytes,
                "profile_memory_bytes": self.profile_memory_bytes, "ram_bytes": psutil.virtual_memory().total,
                "cpu_count": info["cpu_count"], "machine": platform.machine(), "python": info["python"],
                "runtimes": info["runtimes"], "trainer": "native" if self.native else "python", **(extra or {})}

    def serve(self, stop: threading.Event, max_rounds: Optional[int] = None, poll_s: float = 1.0) -> None:
        self.stop = stop
        while not stop.is_set() and (max_rounds is None or self.rounds_done < max_rounds):
            assignment = self.link.next_instruction(timeout_s=poll_s)
            if assignment is None:
                continue
            if isinstance(assignment, Assignment) and self.link.answered(assignment.instruction):
                continue
            handled = self.handle(assignment)
            if stop.is_set():
                break                  # stopping: a round cut short says nothing worth sending
            round = assignment.instruction.round if isinstance(assignment, Assignment) else assignment.round
            late = self.link.superseded(round)
            if handled is None or late:     # the round ended while this device fetched or trained: nobody takes it
                self.log(f"round {round}: dropped: {late or 'its fetch ended'}")
                continue
            report, order, flat = handled
            self.link.report(report, order, flat=flat, settle=settle_peak)
            self.rounds_done += 1
            self.log(f"round {report.round}: {report.status}"
                     + (f" ({report.reason})" if report.reason else f", loss {report.loss_after:.4f}"))

    def memory_for(self, instruction) -> tuple[Optional[int], str]:
        """(the memory this round may use, where that figure comes from): --memory where declared, else the
        group's budget the instruction carries, else the profile's default."""
        if self.memory_bytes is not None:
            return self.memory_bytes, "declared with --memory"
        if (group := instruction.option("memory_budget_bytes")) is not None:
            return int(group), "its group's budget"
        return self.profile_memory_bytes, "its profile's default"

    def check_data(self, artifacts: ArtifactSet) -> None:
        """The local data fits the set, or a ConfigError naming the data file. Its headers and labels only:
        x's values were checked when the agent started (run_cmd), and the Python trainer checks them again as
        it reads, the native trainer batch by batch."""
        x, y = open_local_data(self.data)
        model = ModelInput.of(artifacts)
        check_layout(x, y, model)
        check_labels(y, model.classes)

    def handle(self, assignment) -> Optional[tuple[DeviceReport, Optional[tuple], Optional[np.ndarray]]]:
        """(the report, the order of its trained tensors, their flat float32 buffer as the training process wrote
        it), or None: the round is over before this device could answer."""
        if isinstance(assignment, Unreadable):
            return DeviceReport(round=assignment.round, device_id=self.device_id, config_hash=assignment.config_hash,
                                status="failed", reason=f"refused: {assignment.reason}"), None, None
        ins = assignment.instruction
        t0 = time.perf_counter()
        report = DeviceReport(round=ins.round, device_id=self.device_id, config_hash=ins.config_hash, status="failed")
        predicted = ins.option("predicted_peak_bytes")
        memory, source = self.memory_for(ins)
        if memory is not None and predicted is not None and predicted > memory:
            report.reason = f"refused: predicted peak {predicted} B exceeds this device's memory {memory} B ({source})"
            return report, None, None
        if SET_ROLE not in assignment.artifacts:
            report.reason = f"refused: the instruction names no artifact set (roles: {sorted(assignment.artifacts)})"
            return report, None, None
        try:
            folder = self.link.fetch_artifact(assignment.artifacts[SET_ROLE], self.fetch_timeout_s)
            artifacts = ArtifactSet.open(folder)
        except FetchEnded:
            return None
        except EdgeflError as exc:
            report.reason = f"artifact: {exc}"
            return report, None, None
        suffix = artifacts.suffix
        if suffix.backend != self.runtime:
            report.reason = f"refused: artifact exported for {suffix.backend}, this device trains with {self.runtime}"
            return report, None, None
        try:
            self.check_data(artifacts)
        except EdgeflError as exc:
            report.reason = f"data: {exc}"
            return report, None, None
        if self.link.superseded(ins.round):
            return None
        with tempfile.TemporaryDirectory(prefix="edgefl-round-") as tmp:
            out = Path(tmp) / "upload.npy"
            meter = self.meter() if self.meter else None
            if meter:
                meter.start()
            # the budget is the whole device's: the training process gets what this agent does not hold
            cap = (MemoryCap(max(memory - vm_status("VmRSS"), 1), f"edgefl-{self.device_id}")
                   if self.enforce_memory and memory else None)
            try:
                if self.native is not None:
                    argv = trainer_argv(self.native, folder, self.data, out, lr=ins.lr, seed=ins.seed,
                                        epochs=ins.config.local_epochs, threads=self.threads,
                                        max_examples=ins.option("max_examples"))
                    child = run_process(argv, self.threads, self.train_timeout_s, cap, stop=self.stop)
                else:
                    spec = {"artifacts": str(folder), "data": str(self.data), "lr": ins.lr, "seed": ins.seed,
                            "epochs": ins.config.local_epochs, "threads": self.threads, "runtime": self.runtime,
                            "out": str(out), "max_examples": ins.option("max_examples")}
                    child = run_child("edgefl.device_runtime.worker", spec, self.threads, self.train_timeout_s, cap,
                                      stop=self.stop)
                if child.returncode != 0 and cap is not None and (cap.oom_killed() or child.returncode == -9):
                    child.error = f"out of memory: the training process was killed at its cap {cap.describe()}"
            finally:
                if cap is not None:
                    cap.close()
            try:
                energy = meter.stop() if meter else None
            except RuntimeError as exc:     # a sensor that failed mid-round: the training stands, unmetered
                self.log(f"round {ins.round}: {exc}; the round is reported without its energy")
                energy = None
            report.wall_s = time.perf_counter() - t0
            # the device's peak is the training process's and this agent's (its VmHWM: the agent stays resident
            # beside the child), as the plan predicts it; a failed or killed child keeps its measured peak
            child_peak = (child.result or {}).get("peak_rss_bytes") or child.max_rss_bytes
            agent_peak = vm_status("VmHWM")
            report.peak_rss_bytes = child_peak + agent_peak
            # the cache keeps the set just trained and what its budget allows of the rest
            report.metrics = {"max_rss_bytes": child.max_rss_bytes, "runtime": self.runtime, "agent": "python",
                              "child_peak_bytes": child_peak, "agent_peak_bytes": agent_peak,
                              "memory_budget": {"bytes": memory, "source": source, "enforced": cap is not None},
                              "cache_bytes": self.link.cache.trim(keep=folder)}
            if energy is not None:
                report.metrics["energy"] = energy.to_json()
            if child.returncode != 0:
                report.reason = child.error
                return report, None, None
            buffer = np.load(out)     # the upload as it travels: the link chunks it as it is
        values = sum(e.numel for e in suffix.trainable)
        if buffer.ndim != 1 or buffer.size != values:     # as the native agent checks it
            report.reason = (f"the trainer's upload: {buffer.size} values, the manifest's trainable tensors hold "
                             f"{values}")
            return report, None, None
        r = child.result
        report.status, report.examples = ReportStatus.OK, r["examples"]
        report.loss_before, report.loss_after = r["loss_first"], r["loss_last"]
        # what calibration checks against the plan (edgefl.cost.calibrate): the batch trained and how data was read
        report.metrics.update(steps=r["steps"], train_wall_s=r["wall_s"], torch_loaded=r["torch_loaded"],
                              trainer=r.get("trainer", "python"), batch_size=r["batch_size"], data_read=r["data_read"])
        return report, suffix.trainable, buffer
