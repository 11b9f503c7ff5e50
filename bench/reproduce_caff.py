"""CAFF's Table 1 setting on edgefl's emulation: Shakespeare next-character prediction, pretrained tiny LMs.

CAFF (seed paper 001, sec. 4.1, Table 1): pretrained transformers of 3, 6, 9 and 12 layers, 100 devices, 10 per
round, 75 rounds, each device training 8 batches of 32 per round, fine-tuned with AdamW at lr 1e-4 decayed to
1e-6; every device has the same budget (Table 1 is homogeneous), one column per budget, and every method
runs in every memory column (500 / 700 / 900 MB). Here the budgets keep both: column x is x times the least
budget at which every method of the paper's order has a feasible plan at some depth (the least of each is
recorded), x in `--budget-scale` (default 1, 1.4, 1.8: the paper's 500 : 700 : 900). Budgets are edgefl's
predicted training peaks (cost model of `--runtime`, batch 32, AdamW). `--budget-blocks t,...` sets them
instead to the predicted peaks of fine-tuning the last t blocks (and the output layer) of the deepest model:
the first rule tried, under which Heterogeneous LoRA and FedHM fit no depth at t = 1, 2 (LoRA keeps every
layer's activations for its backward pass, which CAFF's frozen prefix does not).
Methods under each budget, each starting from the set `edgefl pretrain`
wrote: CAFF (chooses among the depths, CAFF eq. 3), Heterogeneous LoRA (method `lora`), FedHM and FedRolex.
A baseline picks its depth as CAFF's Table 1 does (the best of the set it can run): the depth whose plan
admits the most devices, the deeper on a tie; each row records the depths and how many devices each admitted.
Devices are Shakespeare speakers (the natural split), each holding `--windows-per-device` windows (256: the
paper's 8 batches of 32 per round at 1 local epoch). Next-character accuracy on held-out windows every
`--eval-every` rounds.

Fixed before the run, stated here: AdamW with torch's betas (0.9, 0.999) and weight decay 0.01 (the paper:
0.95 and 0.1; edgefl's trainers take no optimizer hyper-parameters), lr 1e-4 cosine-annealed to 1e-6 over the
rounds, seed 0 (`--seed`: the speakers' window subsets and the devices each round samples; the pretrained set
and the held-out windows stay the same, so start accuracies are shared across seeds). The paper's order in
every memory column: CAFF > Heterogeneous LoRA > FedHM > FedRolex. The result records the pretrained set's
held-out loss per depth (it must fall with depth for depth to help).

Needs:     edgefl pretrain -o PRETRAINED --steps 15000 --batch-size 32 --eval-every 100 --patience 10
           --dropout 0.05 [--plays P1,P2,...]  (the CAFF set, l in {3, 6, 9, 12}, each the checkpoint of lowest
           validation loss; CAFF's pretraining dropout, 0.05, none while fine-tuning; the devices are speakers
           of the plays the set was not pretrained on). The published columns fine-tune that set, run over
           several sittings with --resume: bench/results/reproduce_caff_pretrained_15000.json records the
           command and the plays.
Validate:  python bench/reproduce_caff.py --pretrained DIR --rounds 2 --methods caff,fedrolex \\
               --devices 12 --clients-per-round 3 --test-limit 200 -o /tmp/caff.json
Full run:  python bench/reproduce_caff.py --pretrained DIR --rounds R   (split with --budget-scale / --methods:
           a re-run keeps the rows of the others when the settings match; parallel parts written to their own
           -o files are combined with --merge A.json B.json -o OUT.json)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from emulation_grid import run_method  # noqa: E402
from pretrained_set import strictly_decreasing  # noqa: E402
from reproduction import add_energy, compare, merged_from  # noqa: E402

from edgefl.data import load_dataset, parse_partition, subset  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.fleet import parse_fleet  # noqa: E402
from edgefl.planning.strategies import STRATEGIES, PlanContext, get_strategy  # noqa: E402
from edgefl.server.coordinator import LoopSettings  # noqa: E402
from edgefl.zoo.pretrained import fine_tuning_data_options  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reproduce_caff.json"
PAPER_ORDER = ["caff", "lora", "fedhm", "fedrolex"]   # CAFF Table 1, Shakespeare, every memory column
PAPER = {"source": "CAFF (seed paper 001), Table 1 (homogeneous budgets), Shakespeare, memory columns",
         "accuracy": {"500 MB": {"caff": 23.4, "lora": 22.0, "fedhm": 18.5, "fedrolex": 1.3},
                      "700 MB": {"caff": 24.9, "lora": 23.2, "fedhm": 19.0, "fedrolex": 4.5},
                      "900 MB": {"caff": 25.6, "lora": 23.6, "fedhm": 19.0, "fedrolex": 4.5}},
         "setting": "sentencepiece vocabulary 8192, context 256, models pretrained 750K steps on OpenWebText; "
                    "100 devices, 10 per round, 75 rounds, 8 batches of 32 per round, AdamW (0.9, 0.95), "
                    "weight decay 0.1, lr 1e-4 -> 1e-6, mean of 3 seeds"}
BATCH, SEED = 32, 0


def require(methods: list[str], pretrained: Path) -> dict:
    """The pretrained set (depth -> config), or what to do when a method or the set is not there."""
    if missing := [m for m in methods if m not in STRATEGIES]:
        raise SystemExit(f"method(s) {missing} are not in this edgefl (it has {', '.join(STRATEGIES)}); "
                         "Heterogeneous LoRA is method 'lora'")
    try:
        from edgefl.zoo.pretrained import available
        return available(pretrained)
    except EdgeflError as exc:
        raise SystemExit(f"{exc}") from None


def budget_for(ref, blocks: int, runtime: str, optimizer: str) -> int:
    """The predicted peak of fine-tuning the last `blocks` blocks of `ref` (and its output layer)."""
    probe = parse_fleet(f"fleet:\n  groups:\n    p: {{count: 1, memory_budget: 1TiB, runtime: {runtime}}}\n")
    ctx = PlanContext(probe, ref, batch_size=BATCH, optimizer=optimizer)
    return ctx.cost(ctx.config(frozen_prefix=ctx.num_layers - 1 - blocks), runtime).peak_memory_bytes


def pretrained_model(root: Path, depths, train, strategy):
    """The model `edgefl emulate --pretrained` starts from; CAFF chooses among the depths, as there."""
    from edgefl.zoo.pretrained import pretrained_ref

    ref, chosen = pretrained_ref(root, depths, train)
    if strategy.name == "caff":
        strategy.depths = chosen
    return ref


def admits(method: str, budget: int, pretrained: Path, train, runtime: str, optimizer: str) -> bool:
    """Some pretrained depth (CAFF: its own choice among them) has a plan that admits a device of `budget`."""
    from edgefl.zoo.pretrained import available
    strategy = get_strategy(method)
    fleet = fleet_of(1, budget, runtime)
    depths = [None] if method == "caff" else [[d] for d in sorted(available(pretrained))]
    return any(not strategy.plan(PlanContext(fleet, pretrained_model(pretrained, d, train, strategy), batch_size=BATCH,
                                             optimizer=optimizer)).groups["all"].excluded for d in depths)


def least_budgets(methods: list[str], pretrained: Path, train, runtime: str, optimizer: str) -> dict[str, int]:
    """Per method, the least memory budget (to a quarter MiB) at which it can run at all."""
    out = {}
    for method in methods:
        lo, hi = 0, 2**34
        if not admits(method, hi, pretrained, train, runtime, optimizer):
            raise SystemExit(f"{method}: no pretrained depth fits even 16 GiB; check the set in {pretrained}")
        while hi - lo > 2**18:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if admits(method, mid, pretrained, train, runtime, optimizer) else (mid, hi)
        out[method] = hi
    return out


def fleet_of(devices: int, budget: int, runtime: str):
    return parse_fleet(f"fleet:\n  name: shakespeare\n  groups:\n    all: {{count: {devices}, "
                       f"memory_budget: {budget}B, runtime: {runtime}}}\n")


def baseline_ref(strategy, fleet, pretrained: Path, train, settings: LoopSettings, optimizer: str):
    """A baseline's model: the pretrained depth whose plan admits the most devices, the deeper on a tie."""
    from edgefl.zoo.pretrained import available
    admitted = {}
    for depth in sorted(available(pretrained), reverse=True):
        ref = pretrained_model(pretrained, [depth], train, strategy)
        plan = strategy.plan(PlanContext(fleet, ref, rounds=settings.rounds, batch_size=BATCH, optimizer=optimizer))
        admitted[depth] = (sum(g.count for g in fleet.groups if not plan.groups[g.name].excluded), ref)
    depth = max(admitted, key=lambda d: (admitted[d][0], d))
    return admitted[depth][1], {str(d): n for d, (n, _) in admitted.items()}


def start_accuracies(result: dict, pretrained: Path, train, test, device: str = "cpu") -> None:
    """Each row's `start`: the test accuracy of the pretrained model at the depth the method trained, before
    any round (every method's global model starts as it: LoRA's adapters and FedHM's factors add nothing
    yet), so a row shows what fine-tuning added."""
    import re

    from edgefl.engines.local import torch_trainer
    from edgefl.trainconfig import TrainConfig
    from edgefl.zoo import build
    from edgefl.zoo.pretrained import load_pretrained
    found: dict[int, float] = {}
    for rows in result["methods"].values():
        for row in rows.values():
            depth = re.search(r"layers=(\d+)", row.get("model") or "")
            if depth is None or row.get("start") is not None:
                continue
            d = int(depth.group(1))
            if d not in found:
                ref = pretrained_model(pretrained, [d], train, get_strategy("fedrolex"))
                model = build(ref)
                model.load_state_dict(load_pretrained(pretrained, ref))
                found[d] = torch_trainer(ref, device).evaluate(model, TrainConfig(num_layers=len(model.layers)),
                                                               test.x, test.y)["accuracy"]
            row["start"] = found[d]


def summarise(result: dict) -> None:
    """Each budget column's order and verdict, from its rows, and each row's energy estimate."""
    for rows in result["methods"].values():
        add_energy(rows)
    comparisons = {c: compare(rows, PAPER_ORDER) for c, rows in result["methods"].items()}
    result["our_order"] = {c: v["our_order"] for c, v in comparisons.items()}
    result["ties"] = {c: v["ties"] for c, v in comparisons.items()}
    result["matches_paper_order"] = {c: v["matches_paper_order"] for c, v in comparisons.items()}


def merge(paths: list[Path]) -> dict:
    """Result files of one setting run in parallel (other columns or methods) as one."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    for path, part in zip(paths[1:], parts[1:]):
        if part["settings"] != parts[0]["settings"] or part["pretrained"] != parts[0]["pretrained"]:
            raise SystemExit(f"--merge: {path} has other settings or another pretrained set than {paths[0]}")
    result = {**parts[0], "merged_from": merged_from(paths, parts), "methods": {}, "budgets_bytes": {}}
    for part in parts:
        result["budgets_bytes"].update(part["budgets_bytes"])
        for column, rows in part["methods"].items():
            result["methods"].setdefault(column, {}).update(rows)
    summarise(result)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--merge", type=Path, nargs="+", help="combine these result files (one setting) into -o and stop "
                   "(with --pretrained: add the start accuracies rows lack)")
    p.add_argument("--pretrained", type=Path, help="the set written by 'edgefl pretrain -o DIR'")
    p.add_argument("--rounds", type=int, default=75)
    p.add_argument("--methods", default=",".join(PAPER_ORDER))
    p.add_argument("--devices", type=int, default=100)
    p.add_argument("--clients-per-round", type=int, default=10)
    p.add_argument("--budget-scale", default="1,1.4,1.8",
                   help="one homogeneous budget per value (a Table 1 column): that multiple of the least budget at which "
                        "every method runs (Table 1's 500 / 700 / 900 MB, where every method runs in every column)")
    p.add_argument("--budget-blocks", help="instead: the budgets of fine-tuning the last t blocks of the deepest model")
    p.add_argument("--runtime", default="ort")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-final", type=float, default=1e-6)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--test-limit", type=int, default=2000, help="held-out windows evaluated (seeded subset)")
    p.add_argument("--windows-per-device", type=int, default=256,
                   help="a device's local data: at most this many of its speaker's windows (seeded); one window "
                        "starts at every character, so a long role would otherwise train for thousands of steps")
    p.add_argument("--seed", type=int, default=SEED,
                   help="the speakers' window subsets and each round's devices (held-out windows: fixed)")
    p.add_argument("--device", default="cpu")
    p.add_argument("-o", "--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.merge:
        result = merge(args.merge)
        if args.pretrained is not None:
            options = fine_tuning_data_options(args.pretrained, "shakespeare")
            start_accuracies(result, args.pretrained, load_dataset("shakespeare", split="train", **options),
                             subset(load_dataset("shakespeare", split="test", **options), result["settings"]["test_windows"],
                                     SEED + 1), args.device)
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: result[k] for k in ("our_order", "matches_paper_order")}))
        return
    if args.pretrained is None:
        p.error("--pretrained DIR is required (the set 'edgefl pretrain -o DIR' wrote)")
    methods = args.methods.split(",")
    pretrained = require(methods, args.pretrained)

    options = fine_tuning_data_options(args.pretrained, "shakespeare")   # no client holds a pretrained play
    train = load_dataset("shakespeare", split="train", **options)
    test = subset(load_dataset("shakespeare", split="test", **options), args.test_limit, SEED + 1)
    deepest = pretrained_model(args.pretrained, None, train, get_strategy("fedrolex"))
    shares = parse_partition("natural").split(train.y, args.devices, args.seed, groups=train.groups)
    if len(shares) < args.devices:
        raise SystemExit(f"--devices {args.devices}: the data has only {len(shares)} speakers")
    rng = np.random.default_rng(args.seed)
    shares = [np.sort(rng.choice(s, min(len(s), args.windows_per_device), replace=False)) for s in shares[:args.devices]]
    loop = LoopSettings(rounds=args.rounds, clients_per_round=args.clients_per_round, seed=args.seed,
                        eval_every=args.eval_every, lr=args.lr, lr_final=args.lr_final)
    depths = {d: {"held_out_loss": c.get("held_out_loss"), "train_loss": c.get("train_loss"), "steps": c.get("steps"),
                  "total_steps": c.get("total_steps") or c.get("best_step") or c.get("steps"),
                  "best_step": c.get("best_step"), "validation_loss": c.get("validation_loss"),
                  "batch_size": c["settings"].get("batch_size"), "dropout": c["settings"].get("dropout", 0.0)}
              for d, c in sorted(pretrained.items())}
    losses = [v["held_out_loss"] for v in depths.values()]
    settings = {"rounds": args.rounds, "devices": args.devices, "clients_per_round": args.clients_per_round,
                "windows_per_device": args.windows_per_device, "runtime": args.runtime, "optimizer": args.optimizer,
                "optimizer_hyperparameters": "torch defaults: betas (0.9, 0.999), weight decay 0.01" if args.optimizer == "adamw"
                else "momentum 0.9, weight decay 1e-5", "lr": args.lr, "lr_final": args.lr_final, "batch_size": BATCH,
                "local_epochs": 1, "test_windows": len(test.y), "deepest": deepest.label(), "seed": args.seed,
                "plays_kept_out_of_the_clients": options.get("holdout"),
                "budget_rule": "last t blocks of the deepest model" if args.budget_blocks else
                "multiples of the least budget at which every method of the paper's order runs"}
    result = {"paper": PAPER, "settings": settings, "paper_order": PAPER_ORDER,
              "pretrained": {"depths": depths, "held_out_loss_strictly_decreasing_with_depth":
                             strictly_decreasing(losses)},
              "budgets_bytes": {}, "methods": {}, "load_before": os.getloadavg()}
    if args.output.exists():      # a run of other budgets or methods adds to the same settings' rows
        old = json.loads(args.output.read_text())
        if old.get("settings") == settings:
            result["methods"], result["budgets_bytes"] = old["methods"], old["budgets_bytes"]

    from edgefl.zoo.pretrained import load_pretrained
    if args.budget_blocks:
        columns = {f"last {t} blocks": budget_for(deepest, int(t), args.runtime, args.optimizer)
                   for t in args.budget_blocks.split(",")}
    else:
        least = least_budgets(PAPER_ORDER, args.pretrained, train, args.runtime, args.optimizer)
        result["least_budget_bytes"] = least
        common = max(least.values())
        columns = {f"x{float(x):g} of {common / 2**20:.1f} MiB": int(float(x) * common) for x in args.budget_scale.split(",")}
    for column, budget in columns.items():
        result["budgets_bytes"][column] = budget
        fleet = fleet_of(args.devices, budget, args.runtime)
        for method in methods:
            strategy = get_strategy(method)
            if method == "caff":                                           # chooses among every depth (eq. 3)
                ref, admitted = pretrained_model(args.pretrained, None, train, strategy), None
            else:
                ref, admitted = baseline_ref(strategy, fleet, args.pretrained, train, loop, args.optimizer)
            started = time.strftime("%H:%M:%S")
            row = run_method(strategy, fleet, ref, train, test, shares, loop, BATCH, args.device,
                             plan_context={"optimizer": args.optimizer},
                             initial=lambda model: load_pretrained(args.pretrained, model))
            row["devices_admitted_per_depth"] = admitted
            result["methods"].setdefault(column, {})[method] = row
            start_accuracies(result, args.pretrained, train, test, args.device)
            summarise(result)
            result["load_after"] = os.getloadavg()
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps(result, indent=2) + "\n")
            print(f"{started} {column} {method:9} final {row['final']} best {row['best']} model {row.get('model')} "
                  f"excluded {list(row['excluded'])} ({row['wall_s']:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
