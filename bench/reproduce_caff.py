"""CAFF's Table 1 setting on edgefl's emulation: Shakespeare next-character prediction, pretrained tiny LMs.

Devices are Shakespeare speakers (one client per play and role, the natural split), in three equal groups
whose memory budgets equal the predicted training peak (edgefl's cost model, `--runtime`, batch 32) of
fine-tuning the last t blocks (and the output layer) of the deepest pretrained LM, for t in `--budget-blocks`
(default 1, 2, 4: weak, medium, strong devices). Methods under those budgets, each starting from the
pretrained set written by `edgefl pretrain`: CAFF (chooses among the depths of the set, CAFF eq. 3),
Heterogeneous LoRA (method `lora`: per-group adapter rank) and FedRolex (per-group width). Baselines pick
from the set too (CAFF's Table 1 reports '--' where no depth fits): the depth whose plan admits the most
devices, the deeper one on a tie; each row records the depths tried and how many devices each admitted.
SGD lr `--lr` cosine-annealed to a tenth, 1 local epoch, seed 0; next-character accuracy on held-out
windows every `--eval-every` rounds. Writes bench/results/reproduce_caff.json after every run: per method
final and best accuracy, the model it trained, groups it had to exclude; and the ordering beside CAFF's
(CAFF above Heterogeneous LoRA and FedRolex).

Needs:     edgefl pretrain -o PRETRAINED            (the CAFF set, l in {3, 6, 9, 12})
Validate:  python bench/reproduce_caff.py --pretrained DIR --rounds 2 --methods caff,fedrolex \\
               --devices 12 --test-limit 200 -o /tmp/caff.json
Full run:  python bench/reproduce_caff.py --pretrained DIR --rounds R
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from emulation_grid import run_method  # noqa: E402

from edgefl.cli.emulate_cmd import _pretrained_ref, _subset  # noqa: E402  (what `edgefl emulate --pretrained` does)
from edgefl.coordinator import LoopSettings  # noqa: E402
from edgefl.data import load_dataset, parse_partition  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.fleet import parse_fleet  # noqa: E402
from edgefl.strategies import STRATEGIES, PlanContext, get_strategy  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reproduce_caff.json"
PAPER_ORDER = ["caff", "lora", "fedrolex"]          # CAFF Table 1: CAFF above HetLoRA and FedRolex
BATCH, SEED = 32, 0


def require(methods: list[str], pretrained: Path) -> None:
    """Fail with what to do when a method or the pretrained set is not there."""
    if missing := [m for m in methods if m not in STRATEGIES]:
        raise SystemExit(f"method(s) {missing} are not in this edgefl (it has {', '.join(STRATEGIES)}); "
                         "Heterogeneous LoRA is method 'lora': update edgefl, or drop it with --methods caff,fedrolex")
    try:
        from edgefl.pretrain import available
        available(pretrained)
    except ImportError:
        raise SystemExit("this edgefl has no 'edgefl pretrain' (edgefl.pretrain); update edgefl") from None
    except EdgeflError as exc:
        raise SystemExit(f"{exc}") from None


def fleet_for(ref, devices: int, blocks: list[int], runtime: str):
    """Equal groups; group i's budget fits fine-tuning the last blocks[i] blocks of `ref` and no more."""
    probe = parse_fleet(f"fleet:\n  groups:\n    p: {{count: 1, memory_budget: 1TiB, runtime: {runtime}}}\n")
    ctx = PlanContext(probe, ref, batch_size=BATCH)
    layers = ctx.num_layers
    budgets = {t: ctx.cost(ctx.config(frozen_prefix=layers - 1 - t), runtime).peak_memory_bytes for t in blocks}
    counts = [devices // len(blocks) + (i < devices % len(blocks)) for i in range(len(blocks))]
    lines = [f"    t{t}: {{count: {n}, memory_budget: {budgets[t]}B, runtime: {runtime}}}" for t, n in zip(blocks, counts)]
    return parse_fleet("fleet:\n  name: shakespeare\n  groups:\n" + "\n".join(lines) + "\n"), budgets


def baseline_ref(strategy, fleet, pretrained: Path, train, settings: LoopSettings):
    """A baseline's model: the pretrained depth whose plan admits the most devices, the deeper on a tie."""
    from edgefl.pretrain import available
    admitted = {}
    for depth in sorted(available(pretrained), reverse=True):
        ref = _pretrained_ref(pretrained, [depth], train, strategy)
        plan = strategy.plan(PlanContext(fleet, ref, rounds=settings.rounds, batch_size=BATCH))
        admitted[depth] = (sum(g.count for g in fleet.groups if not plan.groups[g.name].excluded), ref)
    depth = max(admitted, key=lambda d: (admitted[d][0], d))
    return admitted[depth][1], {str(d): n for d, (n, _) in admitted.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pretrained", type=Path, required=True, help="the set written by 'edgefl pretrain -o DIR'")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--methods", default=",".join(PAPER_ORDER))
    p.add_argument("--devices", type=int, default=90)
    p.add_argument("--clients-per-round", type=int, default=9)
    p.add_argument("--budget-blocks", default="1,2,4")
    p.add_argument("--runtime", default="ort")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--test-limit", type=int, default=2000, help="held-out windows evaluated (seeded subset)")
    p.add_argument("--windows-per-device", type=int, default=320,
                   help="a device's local data: at most this many of its speaker's windows (seeded); one window "
                        "starts at every character, so a long role would otherwise train for thousands of steps")
    p.add_argument("--device", default="cpu")
    p.add_argument("-o", "--output", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    methods = args.methods.split(",")
    require(methods, args.pretrained)

    train = load_dataset("shakespeare", split="train")
    test = _subset(load_dataset("shakespeare", split="test"), args.test_limit, SEED + 1)
    deepest = _pretrained_ref(args.pretrained, None, train, get_strategy("fedrolex"))
    fleet, budgets = fleet_for(deepest, args.devices, [int(t) for t in args.budget_blocks.split(",")], args.runtime)
    shares = parse_partition("natural").split(train.y, fleet.device_count, SEED, groups=train.groups)
    if len(shares) < fleet.device_count:
        raise SystemExit(f"--devices {args.devices}: the data has only {len(shares)} speakers")
    rng = np.random.default_rng(SEED)
    shares = [np.sort(rng.choice(s, min(len(s), args.windows_per_device), replace=False)) for s in shares[:fleet.device_count]]
    settings = LoopSettings(rounds=args.rounds, clients_per_round=args.clients_per_round, seed=SEED,
                            eval_every=args.eval_every, lr=args.lr, lr_final=args.lr / 10)

    from edgefl.pretrain import load_pretrained
    result = {"rounds": args.rounds, "devices": fleet.device_count, "windows_per_device": args.windows_per_device, "clients_per_round": args.clients_per_round,
              "runtime": args.runtime, "deepest": deepest.label(), "paper_order": PAPER_ORDER,
              "budgets_bytes": {f"last {t} blocks": b for t, b in budgets.items()}, "test_windows": len(test.y),
              "methods": {}, "load_before": os.getloadavg()}
    for method in methods:
        strategy = get_strategy(method)
        if method == "caff":                                               # chooses among every depth (eq. 3)
            ref, admitted = _pretrained_ref(args.pretrained, None, train, strategy), None
        else:
            ref, admitted = baseline_ref(strategy, fleet, args.pretrained, train, settings)
        row = run_method(strategy, fleet, ref, train, test, shares, settings, BATCH, args.device,
                         initial=lambda model: load_pretrained(args.pretrained, model))
        row["devices_admitted_per_depth"] = admitted
        result["methods"][method] = row
        done = [m for m in PAPER_ORDER if result["methods"].get(m, {}).get("final") is not None]
        result["ordering"] = sorted(done, key=lambda m: -result["methods"][m]["final"])
        result["caff_first"] = bool(result["ordering"]) and result["ordering"][0] == "caff"
        print(f"{method:9} final {row['final']} best {row['best']} model {row.get('model')} "
              f"excluded {list(row['excluded'])} ({row['wall_s']:.0f} s)", flush=True)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
