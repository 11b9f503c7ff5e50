"""A paper's main-table comparison on edgefl's emulation: the fleet its budgets describe, its methods, its
ordering beside ours. Shared by bench/reproduce_{fedolf,fedepth,profl}.py (and the tie rule by the others).

A study is a list of runs (label, method, fleet, options); each is planned by the method's own planner and
emulated by the coordinator's round loop (bench/emulation_grid.run_method), and the result file is written
after every run, so a long study keeps what it has. `--merge` combines studies split across processes.
`--state DIR` checkpoints every run after each round in DIR/<label>-<settings hash>/ and resumes a run that
finds its checkpoint there (edgefl.server.runstate, as `edgefl emulate --resume`): a study to convergence,
hours long, runs in pieces that end as the uninterrupted run would.

Ordering rule (SLT's, bench/reproduce_slt.py): methods are ordered by final accuracy; neighbours closer than
one point (TIE) are ties. `matches_paper_order` is true when our order is the paper's, "up to ties" when the
paper's order holds once accuracies within a point count as equal, and false otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from emulation_grid import run_method  # noqa: E402

from edgefl.data import (  # noqa: E402
    load_dataset,
    parse_partition,
    subset,  # noqa: E402  (the subset `edgefl emulate --train-limit` takes)
)
from edgefl.fleet import Fleet, parse_fleet  # noqa: E402
from edgefl.hardware import load_profile  # noqa: E402
from edgefl.planning.strategies import PlanContext  # noqa: E402
from edgefl.server.coordinator import LoopSettings  # noqa: E402
from edgefl.zoo import ModelRef  # noqa: E402

TIE = 0.01
BATCH, SEED = 32, 0
ENERGY_PROFILE = "android-mid"      # the papers' devices are phones and IoT boards; the studies' budgets are ort's


def order_of(rows: dict, methods: list[str]) -> list[str]:
    done = [m for m in methods if rows.get(m, {}).get("final") is not None]
    return sorted(done, key=lambda m: -rows[m]["final"])


def compare(rows: dict, paper_order: list[str]) -> dict:
    """Our order of the paper's methods (those that ran), its ties, and whether it is the paper's."""
    ours = order_of(rows, paper_order)
    ties = [[a, b] for a, b in zip(ours, ours[1:]) if rows[a]["final"] - rows[b]["final"] < TIE]
    paper = [m for m in paper_order if m in ours]
    if len(ours) < len(paper_order):
        match = None                       # not every method ran: no verdict
    elif ours == paper:
        match = True if not ties else "up to ties"
    elif all(rows[a]["final"] >= rows[b]["final"] - TIE for i, a in enumerate(paper) for b in paper[i + 1:]):
        match = "up to ties"
    else:
        match = False
    return {"paper_order": paper_order, "our_order": ours, "ties": ties, "matches_paper_order": match}


def energy_estimate(costs: dict, profile_name: str = ENERGY_PROFILE) -> dict:
    """Joules a run's devices would spend if each were `profile_name`: training at its sustained FLOP/s, moving
    every downloaded and uploaded byte at its uplink rate, drawing its active power all the while (what a device
    without a power meter reports, flagged estimated). The emulation measures FLOPs and bytes, not joules; the
    profile's numbers are its stated estimates (hardware/profiles)."""
    profile = load_profile(profile_name)
    compute_s = costs["training_flops"] / profile.sustained_flops
    transfer_s = 8 * (costs["download_bytes"] + costs["upload_bytes"]) / profile.uplink_bits_per_s
    return {"profile": profile_name, "computation_j": compute_s * profile.power_active_w,
            "communication_j": transfer_s * profile.power_active_w,
            "total_j": (compute_s + transfer_s) * profile.power_active_w}


def add_energy(rows: dict) -> None:
    """Each row that recorded its costs gets its energy estimate."""
    for row in rows.values():
        if row.get("costs"):
            row["energy_estimate"] = energy_estimate(row["costs"])


def group_fleet(name: str, groups: list[tuple[str, int, int]], runtime: str) -> Fleet:
    """Groups (name, devices, memory budget in bytes) of one runtime."""
    lines = [f"    {g}: {{count: {n}, memory_budget: {int(b)}B, runtime: {runtime}}}" for g, n, b in groups]
    return parse_fleet(f"fleet:\n  name: {name}\n  groups:\n" + "\n".join(lines) + "\n")


def peak_bytes(ref: ModelRef, runtime: str, optimizer: str = "sgd", **config) -> int:
    """The cost model's predicted training peak of one configuration (batch BATCH) on `runtime`."""
    probe = group_fleet("probe", [("p", 1, 2**40)], runtime)
    ctx = PlanContext(probe, ref, batch_size=BATCH, optimizer=optimizer)
    return ctx.cost(ctx.config(**config), runtime).peak_memory_bytes


@dataclass
class Run:
    label: str                       # the row's name: a method, or a method with an option ("fedolf+toa0.75")
    method: str
    fleet: Fleet
    emulate: dict = field(default_factory=dict)      # e.g. {"toa": 0.75}
    ceiling: bool = False            # the unconstrained reference, not ordered with the others


@dataclass
class Study:
    """One paper's setting: what every run shares and the paper's numbers it is compared with."""
    name: str
    paper: dict                      # the table and column compared, the paper's accuracies, its order
    settings: dict                   # fixed before the run, written with the results
    paper_order: list[str]
    runs: Callable[[argparse.Namespace, ModelRef], list[Run]]
    model: str = "resnet20"
    clients_per_round: int = 10
    devices: int = 100
    # the paper's table for a non-iid partition where it has one apart from `paper`'s: its "source", "accuracy"
    # and "order" (e.g. FedOLF: Table 2 iid, Table 1 Dirichlet(0.1))
    non_iid: Optional[dict] = None

    def compared_with(self, partition: str) -> tuple[dict, list[str]]:
        """The paper's numbers and order a run on `partition` is compared with."""
        if partition == "iid" or self.non_iid is None:
            return self.paper, self.paper_order
        table = {k: v for k, v in self.non_iid.items() if k != "order"}
        return {**self.paper, **table}, self.non_iid["order"]


def arguments(study: Study, description: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--merge", type=Path, nargs="+", help="combine these result files into -o and stop")
    p.add_argument("--rounds", type=int, default=study.settings.get("rounds"))
    p.add_argument("--partition", default=study.settings.get("partition"))
    p.add_argument("--data", default="fashion-mnist", choices=("fashion-mnist", "mnist"),
                   help="the offline image set the study trains on (28x28 grey, 10 classes both)")
    p.add_argument("--train-limit", type=int, default=study.settings.get("train_limit"),
                   help="a seeded subset of the training set")
    p.add_argument("--test-limit", type=int, default=study.settings.get("test_limit"))
    p.add_argument("--only", help="run only these labels (comma-separated); merge the parts with --merge")
    p.add_argument("--runtime", default="ort", help="the fleet's device runtime, whose cost model sets the budgets")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--device", default="cpu")
    p.add_argument("-o", "--output", type=Path, default=ROOT / "bench" / "results" / f"reproduce_{study.name}.json")
    p.add_argument("--state", type=Path, help="checkpoint each run here every round and resume it from there")
    return p.parse_args(argv)


def run_state(folder: Optional[Path], label: str, settings: dict) -> dict:
    """The `state` keyword of a run checkpointed under `folder` (none without one): its own subfolder per
    label and settings, so a checkpoint is only ever resumed by the run that wrote it."""
    if folder is None:
        return {}
    from edgefl.server.runstate import RunState

    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return {"state": RunState(folder / f"{label}-{digest}", journal=False)}


def summarise(result: dict, paper_order: list[str]) -> None:
    result.update(compare(result["methods"], paper_order))
    add_energy(result["methods"])
    ceilings = [r for r in result["methods"].values() if r.get("ceiling") and r.get("final") is not None]
    result["ceiling_final"] = ceilings[0]["final"] if ceilings else None


def merge(paths: list[Path]) -> dict:
    parts = [json.loads(Path(p).read_text()) for p in paths]
    for path, part in zip(paths[1:], parts[1:]):
        if part["settings"] != parts[0]["settings"]:
            raise SystemExit(f"--merge: {path} has other settings than {paths[0]}; merge only runs of one setting")
        if part.get("budgets_bytes") != parts[0].get("budgets_bytes"):   # the cost model changed between them
            raise SystemExit(f"--merge: {path} has other budgets than {paths[0]} (the constants that price them "
                             "changed between the runs); re-run the older part")
    result = {**parts[0], "merged_from": [Path(p).name for p in paths], "methods": {}}
    for part in parts:
        result["methods"].update(part["methods"])
    summarise(result, parts[0]["paper_order"])
    return result


def main(study: Study, description: str, argv=None) -> None:
    args = arguments(study, description, argv)
    if args.merge:
        result = merge(args.merge)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k] for k in ("our_order", "matches_paper_order")}))
        return
    train = subset(load_dataset(args.data, split="train"), args.train_limit, args.seed)
    test = subset(load_dataset(args.data, split="test"), args.test_limit, args.seed + 1)
    ref = ModelRef.of(study.model, num_classes=10, input_shape=(1, 28, 28))
    settings = {**study.settings, "rounds": args.rounds, "partition": args.partition, "train_limit": args.train_limit,
                "test_limit": args.test_limit, "runtime": args.runtime, "seed": args.seed, "devices": study.devices,
                "clients_per_round": study.clients_per_round, "model": ref.label(), "data": args.data,
                "train_examples": len(train.y), "test_examples": len(test.y)}
    loop = LoopSettings(rounds=args.rounds, clients_per_round=study.clients_per_round, seed=args.seed,
                        eval_every=settings["eval_every"], lr=settings["lr"], lr_final=settings["lr_final"])
    shares = parse_partition(args.partition).split(train.y, study.devices, args.seed)
    runs = study.runs(args, ref)
    fleet = next(r.fleet for r in runs if not r.ceiling)      # the paper's budgets, whichever runs are asked for
    if args.only:
        wanted = args.only.split(",")
        if unknown := [w for w in wanted if w not in {r.label for r in runs}]:
            raise SystemExit(f"--only {unknown}: this study's runs are {[r.label for r in runs]}")
        runs = [r for r in runs if r.label in wanted]
    paper, paper_order = study.compared_with(args.partition)
    result = {"paper": paper, "settings": settings, "methods": {}, "load_before": os.getloadavg()}
    if args.output.exists():     # a re-run of some labels keeps the others' rows
        old = json.loads(args.output.read_text())
        if old.get("settings") == settings:
            result["methods"] = old["methods"]
    result["budgets_bytes"] = {g.name: g.memory_budget_bytes for g in fleet.groups}
    for run in runs:
        started = time.strftime("%H:%M:%S")
        row = run_method(run.method, run.fleet, ref, train, test, shares, loop, BATCH, args.device, **run.emulate,
                         **run_state(args.state, run.label, {**settings, "options": repr(run.emulate)}))
        row.update(method=run.method, ceiling=run.ceiling, options=run.emulate)
        row["groups"] = {g.name: {"devices": g.count, "memory_budget": g.memory_budget_bytes} for g in run.fleet.groups}
        result["methods"][run.label] = row
        summarise(result, paper_order)
        result["load_after"] = os.getloadavg()
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{started} {run.label:16} final {row['final']} best {row['best']} excluded {list(row['excluded'])} "
              f"({row.get('seconds_per_round', 0):.1f} s/round, {row['wall_s']:.0f} s)", flush=True)
