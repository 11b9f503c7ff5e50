"""A paper's main-table comparison on edgefl's emulation: the fleet its budgets describe, its methods, its
ordering beside ours. Shared by bench/reproduce_{fedolf,fedepth,profl}.py (and the tie rule by the others).

A study is a list of runs (label, method, fleet, options); each is planned by the method's own planner and
emulated by the coordinator's round loop (bench/emulation_grid.run_method), and the result file is written
after every run, so a long study keeps what it has. `--merge` combines studies split across processes.
`--state DIR` checkpoints every run after each round in DIR/<label>-<settings hash>/ and resumes a run that
finds its checkpoint there (edgefl.server.runstate, as `edgefl emulate --resume`): a study to convergence,
hours long, runs in pieces that end as the uninterrupted run would.

Ordering rule (SLT's, bench/reproduce_slt.py): methods are ordered by their score, final accuracy, or where
the study scores as its papers do (`score_last` 10: ProFL sec. 4.1, FeDepth, FedOLF) the mean accuracy of the
last 10 rounds, each evaluated; neighbours closer than one point (TIE) are ties. `matches_paper_order` is true when our order is the paper's, "up to ties" when the
paper's order holds once accuracies within a point count as equal, and false otherwise.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import numpy as np

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
# a run has converged when its last-10 mean is less than one point (TIE) above its best evaluation at least
# CONVERGED_SPAN rounds before its end: its last 50 rounds gained less than a point. Fixed before any run.
CONVERGED_SPAN = 50
BATCH, SEED = 32, 0
ENERGY_PROFILE = "android-mid"      # the papers' devices are phones and IoT boards; the studies' budgets are ort's


def score(row: dict) -> float:
    """What a run is ordered by: its last-10 mean where it has one, else its final accuracy."""
    return row["final_last10"] if row.get("final_last10") is not None else row["final"]


def last_rounds(curve: list, rounds: int, last: int) -> dict:
    """A run's last-`last` mean (`final_last10`) and whether it converged, from its curve [(round, accuracy)];
    nothing where its last rounds were not each evaluated."""
    tail = [a for r, a in curve if r > rounds - last]
    if not last or len(tail) < last:
        return {}
    mean = sum(tail) / last
    before = [a for r, a in curve if r <= rounds - CONVERGED_SPAN]
    gain = mean - max(before) if before else None
    return {"final_last10": round(mean, 4),
            "converged": {"converged": gain is not None and gain < TIE,
                          "gain_over_last_rounds": None if gain is None else round(gain, 4),
                          "span_rounds": CONVERGED_SPAN,
                          "rule": f"last-{last} mean less than {TIE:.0%} above the best evaluation at least "
                                  f"{CONVERGED_SPAN} rounds before the end"}}


def order_of(rows: dict, methods: list[str]) -> list[str]:
    done = [m for m in methods if rows.get(m, {}).get("final") is not None]
    return sorted(done, key=lambda m: -score(rows[m]))


def compare(rows: dict, paper_order: list[str]) -> dict:
    """Our order of the paper's methods (those that ran), its ties, and whether it is the paper's."""
    ours = order_of(rows, paper_order)
    ties = [[a, b] for a, b in zip(ours, ours[1:]) if score(rows[a]) - score(rows[b]) < TIE]
    paper = [m for m in paper_order if m in ours]
    if len(ours) < len(paper_order):
        match = None                       # not every method ran: no verdict
    elif ours == paper:
        match = True if not ties else "up to ties"
    elif all(score(rows[a]) >= score(rows[b]) - TIE for i, a in enumerate(paper) for b in paper[i + 1:]):
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


def convergence_column(name: str, settings: dict, rounds: int = 300) -> dict:
    """A study's `--column to-convergence`: its setting run `rounds` rounds, until the curves flatten, and scored
    by the mean of the last 10 rounds, each evaluated. Where a paper reports a final accuracy averaged over
    several runs (FeDepth 5, FedOLF 3), which 2 seeds here cannot average out, the last-10 mean of a converged
    run estimates the same accuracy with the round-to-round noise averaged."""
    return {"name": f"{name}_convergence", "settings": {**settings, "rounds": rounds}, "score_last": 10}


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
    options: dict = field(default_factory=dict)      # the method's own, e.g. ProFL's {"blocks": 2}
    evidence: bool = False           # a run that tests an explanation of the order, not one of the paper's rows

    def strategy(self):
        from edgefl.planning.strategies import STRATEGIES
        return STRATEGIES[self.method](**self.options) if self.options else self.method


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
    score_last: int = 0              # 10: scored as the mean of the last 10 rounds (`last_rounds`)
    input_shape: tuple = (1, 28, 28)      # the 28x28 images are zero-padded to it (VGG-11 needs 32x32)
    # the paper's other columns: a name -> the fields it changes (model, paper, paper_order, settings, ...)
    columns: dict = field(default_factory=dict)
    column: str = ""                 # the default column's name, where there are others

    def compared_with(self, partition: str) -> tuple[dict, list[str]]:
        """The paper's numbers and order a run on `partition` is compared with."""
        if partition == "iid" or self.non_iid is None:
            return self.paper, self.paper_order
        table = {k: v for k, v in self.non_iid.items() if k != "order"}
        return {**self.paper, **table}, self.non_iid["order"]


def arguments(study: Study, description: str, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--merge", type=Path, nargs="+", help="combine these result files into -o and stop")
    p.add_argument("--combine", type=Path, nargs="+", help="these result files (columns, seeds) as one file, -o")
    if study.columns:
        p.add_argument("--column", choices=sorted(study.columns), help="the paper's other columns (default: "
                       f"{study.model}'s)")
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
    p.add_argument("--device", default="cpu", help="where the emulated devices train: cpu, or cuda (recorded in the settings)")
    p.add_argument("-o", "--output", type=Path, help=f"the result file (default: bench/results/reproduce_"
                   f"{study.name}{'_seed<S>' if study.score_last else '[_seed<S> at a seed other than 0]'}.json; "
                   f"with --combine, reproduce_{study.name}.json)")
    p.add_argument("--state", type=Path, help="checkpoint each run here every round and resume it from there")
    args = p.parse_args(argv)
    if args.output is None:
        # a seed's own file, so another seed's run never overwrites it; a study to convergence (scored by its
        # last rounds) is combined from its seeds' files into the seedless name
        seeded = not args.combine and (args.seed or study.score_last)
        args.output = ROOT / "bench" / "results" / f"reproduce_{study.name}{f'_seed{args.seed}' if seeded else ''}.json"
    return args


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


def merged_from(paths: list[Path], parts: list[dict]) -> list[str]:
    """Every run file a merge is built from, in the order merged: a part that is itself a merge names its own
    sources (a column finished over several sessions is merged into its last result, part by part), so the
    provenance is not only the last merge's two files. A later file's rows replace an earlier one's."""
    names: list[str] = []
    for path, part in zip(paths, parts):
        names += [n for n in part.get("merged_from") or [Path(path).name] if n not in names]
    return names


def merge(paths: list[Path]) -> dict:
    parts = [json.loads(Path(p).read_text()) for p in paths]
    for path, part in zip(paths[1:], parts[1:]):
        if part["settings"] != parts[0]["settings"]:
            raise SystemExit(f"--merge: {path} has other settings than {paths[0]}; merge only runs of one setting")
        if part.get("budgets_bytes") != parts[0].get("budgets_bytes"):   # the cost model changed between them
            raise SystemExit(f"--merge: {path} has other budgets than {paths[0]} (the constants that price them "
                             "changed between the runs); re-run the older part")
    result = {**parts[0], "merged_from": merged_from(paths, parts), "methods": {}}
    for part in parts:
        result["methods"].update(part["methods"])
    summarise(result, parts[0]["paper_order"])
    return result


def padded(data, shape: tuple):
    """The 28x28 images zero-padded evenly to `shape`'s height and width."""
    dh, dw = shape[-2] - data.x.shape[-2], shape[-1] - data.x.shape[-1]
    if (dh, dw) == (0, 0):
        return data
    x = np.pad(data.x, ((0, 0), (0, 0), (dh // 2, dh - dh // 2), (dw // 2, dw - dw // 2)))
    return replace(data, x=x)


KEPT = ("final_last10", "best", "final", "converged", "ceiling", "evidence", "excluded", "wall_s",
        "seconds_per_round")


def combine(paths: list[Path], default_column: str) -> dict:
    """One file of a study's result files, by column and seed: each seed's rows (KEPT), order and verdict, and
    per column the order of the methods' means over the seeds that ran them all, under the same tie rule.
    Files of one column and seed (a study split across processes, its evidence runs) are one seed's rows; a
    column run on another device than the CPU is keyed "<column> on <device>"."""
    columns: dict = {}
    for path in paths:
        part = json.loads(Path(path).read_text())
        settings = {k: v for k, v in part["settings"].items() if k != "seed"}
        settings["column"] = settings.get("column") or default_column
        # a column trained on a GPU is its own column beside the CPU one: its runs are never merged with those
        key = settings["column"] + (f" on {settings['device']}" if settings.get("device") else "")
        column = columns.setdefault(key, {
            "settings": settings, "paper": part["paper"], "paper_order": part["paper_order"], "seeds": {}})
        if column["settings"] != settings:
            raise SystemExit(f"--combine: {path} has other settings than the column's first file")
        rows = {m: {k: r[k] for k in KEPT if k in r} for m, r in part["methods"].items()}
        seed = column["seeds"].get(str(part["settings"]["seed"]))
        if seed is not None and seed["budgets_bytes"] != part["budgets_bytes"]:
            raise SystemExit(f"--combine: {path} has other budgets than {seed['files'][0]} of the same seed")
        if seed is not None:
            rows = {**seed["methods"], **rows}
        column["seeds"][str(part["settings"]["seed"])] = {
            "files": [*(seed["files"] if seed else []), Path(path).name], "budgets_bytes": part["budgets_bytes"],
            "methods": rows, **compare(rows, part["paper_order"])}
    for column in columns.values():
        runs = list(column["seeds"].values())
        done = set.intersection(*(set(m for m, r in run["methods"].items() if r.get("final") is not None)
                                  for run in runs))
        means = {m: {key: sum(run["methods"][m][key] for run in runs) / len(runs) for key in ("final_last10", "best")
                     if all(run["methods"][m].get(key) is not None for run in runs)} for m in sorted(done)}
        column["mean"] = {"seeds": sorted(column["seeds"]), "methods": means,
                          **compare({m: {"final": v.get("final_last10", v["best"]), **v} for m, v in means.items()},
                                    column["paper_order"])}
    return {"schema": "edgefl.reproduction/2", "columns": columns}


def main(study: Study, description: str, argv=None) -> None:
    args = arguments(study, description, argv)
    if getattr(args, "column", None):       # its settings are other defaults: parse again with them
        study = replace(study, **study.columns[args.column])
        args = arguments(study, description, argv)
    if args.combine:
        args.output.write_text(json.dumps(combine(args.combine, study.column or study.name), indent=2) + "\n")
        return
    if args.merge:
        result = merge(args.merge)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k] for k in ("our_order", "matches_paper_order")}))
        return
    train = padded(subset(load_dataset(args.data, split="train"), args.train_limit, args.seed), study.input_shape)
    test = padded(subset(load_dataset(args.data, split="test"), args.test_limit, args.seed + 1), study.input_shape)
    ref = ModelRef.of(study.model, num_classes=10, input_shape=study.input_shape)
    settings = {**study.settings, "rounds": args.rounds, "partition": args.partition, "train_limit": args.train_limit,
                "test_limit": args.test_limit, "runtime": args.runtime, "seed": args.seed, "devices": study.devices,
                "clients_per_round": study.clients_per_round, "model": ref.label(), "data": args.data,
                "train_examples": len(train.y), "test_examples": len(test.y),
                # a column run on another device is another setting: --merge and --combine keep them apart
                **({"device": args.device} if args.device != "cpu" else {}),
                **({"score_last": study.score_last, "column": getattr(args, "column", None) or study.column} if study.score_last else {})}
    loop = LoopSettings(rounds=args.rounds, clients_per_round=study.clients_per_round, seed=args.seed,
                        eval_every=settings["eval_every"], eval_last=study.score_last, lr=settings["lr"],
                        lr_final=settings["lr_final"])
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
        row = run_method(run.strategy(), run.fleet, ref, train, test, shares, loop, BATCH, args.device, **run.emulate,
                         **run_state(args.state, run.label, {**settings, "options": repr(run.emulate),
                                                             **({"method_options": run.options} if run.options else {})}))
        row.update(method=run.method, ceiling=run.ceiling, evidence=run.evidence, options=run.emulate, **last_rounds(
            row["curve"], args.rounds, study.score_last))
        if run.options:
            row["method_options"] = run.options
        row["groups"] = {g.name: {"devices": g.count, "memory_budget": g.memory_budget_bytes} for g in run.fleet.groups}
        result["methods"][run.label] = row
        summarise(result, paper_order)
        result["load_after"] = os.getloadavg()
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"{started} {run.label:16} final {row['final']} last-10 {row.get('final_last10')} best {row['best']} excluded {list(row['excluded'])} "
              f"({row.get('seconds_per_round', 0):.1f} s/round, {row['wall_s']:.0f} s)", flush=True)
