"""SLT's Tables 1-2 setting on edgefl's emulation: ResNet-20 on Fashion-MNIST under a memory budget.

100 devices, 10 per round, iid and Dirichlet(0.1) label skew. Every device's memory budget equals the
predicted training peak (edgefl's cost model, batch 32) of the width-s ResNet-20 trained end to end, for s
in {0.125, 0.25}: the small model at s fits exactly. The fleet's runtime (`--runtime`, default ort, what
the devices run) picks the cost model's constants; the emulation trains every device with the torch
Trainer either way. (Under the torch runtime's constants, a ~100 MiB workspace term that grows with the
model's widest layer outweighs SLT's activation savings: no SLT step fits at s = 0.125.) Methods under that budget: SLT,
small model, FedRolex, Federated Dropout; unconstrained FedAvg (a budget the full model fits) is the
ceiling. SGD lr 0.05 (momentum 0.9, weight decay 1e-5) cosine-annealed to 0.005 over R rounds, batch 32,
1 local epoch, seed 0; test accuracy on the 10,000 test images every `--eval-every` rounds and at the end.

Writes bench/results/reproduce_slt.json after every run (a long run keeps what it has): per setting
(partition, s) and method the final and best accuracy, the curve, seconds per round; the ordering of the
four constrained methods by final accuracy beside SLT's (SLT > small model > FedRolex > FD).

Validate:  python bench/reproduce_slt.py --rounds 2 --train-limit 2000 --test-limit 500 -o /tmp/slt.json
Full run:  python bench/reproduce_slt.py --rounds R       (about an hour per setting on 2 CPU cores: see
           seconds_per_round in a short run and pick R; the JSON states R)
Split:     run partitions, widths or methods in separate processes (-o each its own file), then
           python bench/reproduce_slt.py --merge A.json B.json ...   (a later file's run replaces an earlier one's)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from emulation_grid import one_group_fleet, run_method  # noqa: E402
from reproduction import compare, merged_from  # noqa: E402

from edgefl.data import (  # noqa: E402
    load_dataset,
    parse_partition,
    subset,  # noqa: E402  (the subset `edgefl emulate --train-limit` takes)
)
from edgefl.planning.strategies import PlanContext  # noqa: E402
from edgefl.server.coordinator import LoopSettings  # noqa: E402
from edgefl.zoo import ModelRef  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reproduce_slt.json"
CONSTRAINED = ("slt", "small", "fedrolex", "fd")
PAPER_ORDER = ["slt", "small", "fedrolex", "fd"]        # SLT Tables 1-2, at s = 0.125 and 0.25
DEVICES, PER_ROUND, BATCH, SEED = 100, 10, 32, 0


def budget_for_width(ref: ModelRef, s: float, runtime: str = "torch") -> int:
    """Predicted peak memory of training the width-s model end to end (the small model's config)."""
    ctx = PlanContext(one_group_fleet("probe", 1, 2**40, runtime), ref, batch_size=BATCH)
    return ctx.cost(ctx.config(head_start=0, head_width=s), runtime).peak_memory_bytes


def merge(paths: list[Path]) -> dict:
    """One result out of runs split across processes: same R, data and devices required."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    same = ("rounds", "devices", "clients_per_round", "model", "train_examples", "test_examples", "runtime")
    for path, part in zip(paths[1:], parts[1:]):
        if differ := [k for k in same if part.get(k) != parts[0].get(k)]:
            raise SystemExit(f"--merge: {path} differs from {paths[0]} in {differ}; merge only runs of one setting")
    result = {**parts[0], "merged_from": merged_from(paths, parts), "settings": {}}
    for part in parts:
        result["budgets_bytes"] = {**result["budgets_bytes"], **part["budgets_bytes"]}
        for setting, rows in part["settings"].items():
            result["settings"].setdefault(setting, {}).update(rows)
    return result


def summarise(result: dict) -> None:
    """Orderings by final accuracy and whether they are the paper's, by the rule every reproduction uses
    (bench/reproduction.compare: neighbours within a point are ties, and an order that needs one to
    match reads 'up to ties')."""
    verdicts = {k: compare(rows, PAPER_ORDER) for k, rows in result["settings"].items() if not k.endswith("ceiling")}
    result["orderings"] = {k: v["our_order"] for k, v in verdicts.items()}
    result["ties"] = {k: v["ties"] for k, v in verdicts.items()}
    result["matches_paper_order"] = {k: v["matches_paper_order"] for k, v in verdicts.items()
                                     if v["matches_paper_order"] is not None}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--merge", type=Path, nargs="+", help="combine these result files into -o and stop")
    p.add_argument("--rounds", type=int)
    p.add_argument("--partitions", default="iid,dirichlet:0.1")
    p.add_argument("--widths", default="0.125,0.25")
    p.add_argument("--methods", default=",".join(CONSTRAINED + ("fedavg",)))
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--train-limit", type=int, default=None, help="a seeded subset of the training set (validation)")
    p.add_argument("--test-limit", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--runtime", default="ort", help="the fleet's device runtime: ort | executorch | torch")
    p.add_argument("-o", "--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.merge:
        result = merge(args.merge)
        summarise(result)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({"orderings": result["orderings"], "matches_paper_order": result["matches_paper_order"]}))
        return
    if args.rounds is None:
        p.error("--rounds is required (or --merge)")

    train = subset(load_dataset("fashion-mnist", split="train"), args.train_limit, SEED)
    test = subset(load_dataset("fashion-mnist", split="test"), args.test_limit, SEED + 1)
    ref = ModelRef.of("resnet20", num_classes=10, input_shape=(1, 28, 28))
    settings = LoopSettings(rounds=args.rounds, clients_per_round=PER_ROUND, seed=SEED, eval_every=args.eval_every,
                            lr=0.05, lr_final=0.005)
    methods = args.methods.split(",")
    widths = [float(s) for s in args.widths.split(",")]
    full_budget = budget_for_width(ref, 1.0, args.runtime)
    result = {"rounds": args.rounds, "devices": DEVICES, "clients_per_round": PER_ROUND, "model": ref.label(),
              "train_examples": len(train.y), "test_examples": len(test.y), "eval_every": args.eval_every,
              "paper_order": PAPER_ORDER, "runtime": args.runtime,
              "budgets_bytes": {f"s={s:g}": budget_for_width(ref, s, args.runtime) for s in widths},
              "ceiling_budget_bytes": full_budget, "settings": {}, "load_before": os.getloadavg()}

    def save():
        summarise(result)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")

    for partition in args.partitions.split(","):
        shares = parse_partition(partition).split(train.y, DEVICES, SEED)
        runs = [(f"{partition}/s={s:g}", m, result["budgets_bytes"][f"s={s:g}"]) for s in widths
                for m in methods if m != "fedavg"]
        if "fedavg" in methods:
            runs.append((f"{partition}/ceiling", "fedavg", full_budget))
        for setting, method, budget in runs:
            fleet = one_group_fleet(setting.replace("/", "-").replace(":", ""), DEVICES, budget, args.runtime)
            started = time.strftime("%H:%M:%S")
            row = run_method(method, fleet, ref, train, test, shares, settings, BATCH, args.device)
            result["settings"].setdefault(setting, {})[method] = row
            print(f"{started} {setting:22} {method:9} final {row['final']} best {row['best']} "
                  f"({row.get('seconds_per_round', 0):.1f} s/round, {row['wall_s']:.0f} s)", flush=True)
            save()
    result["load_after"] = os.getloadavg()
    save()


if __name__ == "__main__":
    main()
