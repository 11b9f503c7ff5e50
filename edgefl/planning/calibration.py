"""What a served run says about the plan it ran, for `edgefl calibrate` (edgefl.cost.calibrate fits it): each
report's measured peak beside the peak the plan predicted for that device's config, or why the report is no
evidence about the plan (edgefl.cost.calibrate.refusal); and, once a calibration is fitted, what it changes in
a plan."""
from __future__ import annotations

import json
from pathlib import Path

from edgefl.cost.calibrate import PeakSample, Refused, refusal
from edgefl.cost.constants import DEFAULTS
from edgefl.cost.model import config_cost
from edgefl.cost.profile_store import ProfileStore
from edgefl.errors import ConfigError
from edgefl.planning.plan import Plan
from edgefl.units import format_bytes


def samples_from_run(run: str | Path, store=None) -> tuple[list[PeakSample], list[Refused]]:
    """Predicted and measured peaks of every report in a run folder (history.json + plan.json), with the
    config each device trained; and the reports refused, with why (module doc)."""
    run = Path(run)
    store = store or ProfileStore()
    try:
        history = json.loads((run / "history.json").read_text())
        plan = Plan.read(run / "plan.json")
        out, refused = [], []
        for record in history["rounds"]:
            measured = record.get("measured_peak_bytes") or {}
            metrics = record.get("device_metrics") or {}
            examples = record.get("examples") or {}
            for device, peak in measured.items():
                group = plan.groups[record["sampled"][device]]
                step = group.step_at(record["round"])
                configs = step.sequence or (step.config,)
                costs = [config_cost(store, plan.model, c, group.runtime, DEFAULTS[group.runtime]) for c in configs]
                k = DEFAULTS[group.runtime].for_model(plan.model.name)
                config, terms = max(zip(configs, (c.terms for c in costs)), key=lambda ct: ct[1].peak(k))
                failed = (record.get("failed") or {}).get(device)
                why = (f"its round failed ({failed}): a peak cut short" if failed else
                       refusal(config.batch_size, group.examples, int(examples.get(device, 0)), metrics.get(device, {})))
                if why:
                    refused.append(Refused(device, record["round"], why))
                    continue
                # calibration fits the training process: the agent's share of the promise (predicted) and of the
                # device's peak (measured, reported apart) stay out
                predicted = record["predicted_peak_bytes"][device] - step.predicted.agent_bytes
                child = metrics.get(device, {}).get("child_peak_bytes", peak)
                out.append(PeakSample(group.runtime, group.name, device, record["round"], predicted, int(child),
                                      terms, plan.model.name))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{run}: not a served run with measured peaks ({type(exc).__name__}: {exc}); "
                          "calibrate needs the history.json and plan.json that 'edgefl serve --state DIR' writes") from None
    if not out and not refused:
        raise ConfigError(f"{run}/history.json has no measured peak RSS in any report; calibrate needs a run "
                          "served to real devices ('edgefl serve'), not an emulation")
    return out, refused


def plan_changes(without, with_calibration) -> list[str]:
    """Per group, what the calibration changed in a plan (Plan without it -> with it): admission, the first
    step's config, its predicted peak. One line per changed group, or one saying nothing changed."""
    lines = []
    for name, g in with_calibration.groups.items():
        old = without.groups.get(name)
        if old is None:
            continue
        if old.excluded != g.excluded:
            state = {True: "excluded", False: "admitted"}
            lines.append(f"group {name}: {state[g.excluded]} with the calibration, {state[old.excluded]} without")
            continue
        if g.excluded:
            continue
        a, b = old.steps[0], g.steps[0]
        fields = [(f, getattr(a.config, f), getattr(b.config, f)) for f in ("frozen_prefix", "end", "head_width", "rank")]
        what = [f"{f.replace('_', ' ')} {x} -> {y}" for f, x, y in fields if x != y]
        if what or len(old.steps) != len(g.steps) or a.predicted.peak_memory_bytes != b.predicted.peak_memory_bytes:
            what.append(f"predicted peak {format_bytes(a.predicted.peak_memory_bytes)} -> "
                        f"{format_bytes(b.predicted.peak_memory_bytes)}")
            lines.append(f"group {name}: " + ", ".join(what))
    return lines or ["the calibration changes no group's admission or first config"]
