"""What `edgefl report` reads from a run folder and derives from it: no plotting, no HTML.

A run folder holds config.json (the command's settings), plan.json and history.json, as `edgefl emulate -o`
and `edgefl serve --state` write them. Everything here is read from those files or computed from them; a
setting a run did not record is shown as such, never filled in.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edgefl.errors import ConfigError
from edgefl.planning.plan import Plan
from edgefl.server.history import read_history
from edgefl.units import format_bytes

NOT_RECORDED = "not recorded"
STATUSES = ("trained", "skipped", "failed", "rejected", "missing")   # what became of each sampled device


@dataclass
class Run:
    name: str
    folder: Path
    rounds: list[dict]        # history.json records
    plan: Plan
    config: dict              # config.json ({} when the folder has none)

    @property
    def served(self) -> bool:
        """`edgefl serve` records its broker; an older folder without config.json: devices measured peaks."""
        if self.config:
            return "broker" in self.config
        return any(r.get("measured_peak_bytes") for r in self.rounds)

    @property
    def kind(self) -> str:
        return "served" if self.served else "emulated"

    def evaluated(self, key: str = "accuracy") -> list[tuple[int, float]]:
        return [(r["round"], r[key]) for r in self.rounds if r.get(key) is not None]

    def final(self, key: str) -> Optional[float]:
        points = self.evaluated(key)
        return points[-1][1] if points else None


def load_run(folder: Path) -> Run:
    try:
        history = {"rounds": read_history(folder / "history.json")}
    except OSError:
        if (folder / "plan.json").is_file():
            raise ConfigError(f"{folder}: no round finished (it holds the plan but no history.json): the run stopped "
                              "before its first round ended, or is in it; report it once a round has finished") from None
        raise ConfigError(f"{folder}: no history.json; give a folder written by 'edgefl emulate -o' or "
                          "'edgefl serve'") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{folder}/history.json: not a run history ({type(exc).__name__}: {exc})") from None
    config = {}
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text())
        except ValueError as exc:
            raise ConfigError(f"{folder}/config.json: not JSON ({exc})") from None
    return Run(folder.name, folder, history["rounds"], Plan.read(folder / "plan.json"), config)


def participation(record: dict) -> dict[str, int]:
    """Per status, how many of the round's sampled devices ended there. A device whose report was accepted
    counts as trained even if a further report of it was rejected; rejected reports of devices not sampled
    are not the round's devices."""
    sampled = set(record["sampled"])
    trained = set(record.get("examples") or {}) & sampled
    failed = set(record.get("failed") or {}) & sampled
    return {"trained": sum((record.get("participating_devices") or {}).values()),
            "skipped": len(set(record.get("skipped") or {}) & sampled),
            "failed": len(failed),
            "rejected": len((set(record.get("rejected") or {}) & sampled) - trained - failed),
            "missing": len(set(record.get("missing") or []) & sampled)}


def cumulative(values) -> list[float]:
    total, out = 0.0, []
    for v in values:
        total += v or 0
        out.append(total)
    return out


def measured_peaks(run: Run) -> dict[str, list[int]]:
    """Per group, the peak RSS its devices reported (served runs; emulated devices measure none)."""
    out: dict[str, list[int]] = {}
    for r in run.rounds:
        for device, peak in (r.get("measured_peak_bytes") or {}).items():
            out.setdefault(r["sampled"][device], []).append(peak)
    return out


def prediction_error(run: Run) -> Optional[float]:
    """Median |predicted - measured| / measured peak over a served run's reports."""
    errs = [abs(r["predicted_peak_bytes"][d] - m) / m for r in run.rounds
            for d, m in (r.get("measured_peak_bytes") or {}).items() if m]
    return statistics.median(errs) if errs else None


def _examples(run: Run) -> str:
    c = run.config
    if "train_examples" in c:
        return f"{c['train_examples']} training, {c.get('test_examples', NOT_RECORDED)} test"
    per_group = [f"{g.name}: {g.count} x {g.examples}" for g in run.plan.groups.values() if g.examples]
    return "per device (plan): " + ", ".join(per_group) if per_group else NOT_RECORDED


def _clients_per_round(run: Run) -> str:
    if "clients_per_round" in run.config:
        return str(run.config["clients_per_round"])
    sampled = [len(r["sampled"]) for r in run.rounds]
    return f"{max(sampled)} (most sampled in a round, from history)" if sampled else NOT_RECORDED


def settings(run: Run) -> list[tuple[str, str]]:
    """The settings table of a run: (setting, value) rows, each read from its folder."""
    c, plan = run.config, run.plan

    def get(key: str, absent: str = NOT_RECORDED) -> str:
        value = c.get(key)
        return absent if value is None else str(value)

    kind = f"served over MQTT ({c['broker']})" if c.get("broker") else run.kind
    rows = [("run", kind), ("folder", str(run.folder)),
            ("data set", get("dataset", "none (no evaluation)" if run.served else NOT_RECORDED)),
            ("partition", get("partition", "the devices' own data (a served run's server holds none of it)"
                              if run.served else NOT_RECORDED)), ("examples", _examples(run)),
            ("clients per round", _clients_per_round(run)),
            ("rounds", f"{len(run.rounds)} completed of {c.get('rounds', plan.rounds)}"),
            ("seed", get("seed")), ("method", plan.method), ("model", plan.model.describe()),
            ("batch size", str(plan.batch_size)), ("local epochs", str(plan.local_epochs)),
            ("optimizer", plan.optimizer), ("learning rate", get("lr"))]
    extra = [("trained on", "device"), ("FedOLF TOA share", "toa"), ("measure memory", "measure_memory"),
             ("pretrained from", "pretrained"), ("round timeout (s)", "round_timeout_s"),
             ("min reports", "min_reports"), ("update clip norm", "clip_norm")]
    rows += [(label, str(c[key])) for label, key in extra if c.get(key) is not None]
    return rows + [("edgefl version", get("edgefl_version"))]


def group_rows(run: Run) -> list[dict]:
    """Per plan group: its budget, predicted peak (the whole device's: the agent and the training process), the
    largest its devices measured (served runs), whether it takes part (and why not), device-rounds trained."""
    trained: dict[str, int] = {}
    measured = measured_peaks(run)
    for r in run.rounds:
        for g, n in (r.get("participating_devices") or {}).items():
            trained[g] = trained.get(g, 0) + n
    rows = []
    for name in sorted(run.plan.groups):
        g = run.plan.groups[name]
        peak = max((s.predicted.peak_memory_bytes for s in g.steps), default=None)
        rows.append({"group": name, "devices": g.count, "runtime": g.runtime,
                     "memory budget": format_bytes(g.memory_budget_bytes),
                     "predicted peak": format_bytes(peak) if peak is not None else "-",
                     "measured peak (max)": format_bytes(max(measured[name])) if measured.get(name) else "-",
                     "status": _status(g),
                     "device-rounds trained": trained.get(name, 0)})
    return rows


def _status(g) -> str:
    """'takes part', with the rounds it sits out and the budgets that keep it out; or why it is excluded."""
    if g.excluded:
        return f"excluded: {g.reason}"
    return "; ".join(["takes part"] + [f"sits out {o.describe()}" for o in g.sits_out])


def device_rows(run: Run) -> list[dict]:
    """Per device of a served run: rounds it trained, its whole-device peak memory (the agent and the training
    process) measured against the predicted one and its group's budget (the largest ratio: the promise holds
    for every round or it does not), energy (with its source) and bytes moved, summed over the rounds that
    recorded them."""
    devices = sorted({d for r in run.rounds for d in r["sampled"]})
    rows = []
    for d in devices:
        mine = [r for r in run.rounds if d in r["sampled"]]
        predicted = [r["predicted_peak_bytes"][d] for r in mine if d in (r.get("predicted_peak_bytes") or {})]
        pairs = [(r["predicted_peak_bytes"][d], r["measured_peak_bytes"][d]) for r in mine   # (predicted, measured)
                 if (r.get("measured_peak_bytes") or {}).get(d) and d in (r.get("predicted_peak_bytes") or {})]
        metrics = [r["device_metrics"][d] for r in mine if d in (r.get("device_metrics") or {})]
        energy = [m["energy"] for m in metrics if isinstance(m.get("energy"), dict)]
        sources = sorted({e["source"] + (" (estimated)" if e.get("estimated") else "") for e in energy})
        agent = [m["agent_peak_bytes"] for m in metrics if m.get("agent_peak_bytes")]
        group = run.plan.groups.get(mine[0]["sampled"][d])
        rows.append({
            "device": d, "group": mine[0]["sampled"][d],
            "rounds trained": sum(d in (r.get("examples") or {}) for r in mine), "rounds sampled": len(mine),
            "predicted peak (max)": format_bytes(max(predicted)) if predicted else "-",
            "measured peak (max)": format_bytes(max(m for _, m in pairs)) if pairs else "not measured",
            "of which agent": format_bytes(max(agent)) if agent else "-",
            "memory budget": format_bytes(group.memory_budget_bytes) if group is not None else "-",
            "measured / predicted (max)": f"{max(m / p for p, m in pairs):.2f}" if pairs else "-",
            "energy (training)": f"{sum(e['joules'] for e in energy):.3g} J over {len(energy)} round"
                                 f"{'s' * (len(energy) != 1)}"
            if energy else "not measured",
            "energy source": ", ".join(sources) or "-",
            "upload": _traffic(metrics, "upload"), "download": _traffic(metrics, "download")})
    return rows


def _traffic(metrics: list[dict], direction: str) -> str:
    """Payload bytes a device moved in one direction, summed over the rounds whose reports recorded them."""
    moved = [m["transport"][direction]["payload_bytes"] for m in metrics
             if isinstance(m.get("transport"), dict) and "payload_bytes" in m["transport"].get(direction, {})]
    return format_bytes(sum(moved)) if moved else NOT_RECORDED
