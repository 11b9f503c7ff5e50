"""FeDepth's Table 2 setting (seed paper 003) on edgefl's emulation: depth-wise training under the "Fair" budgets.

The paper (sec. 5): PreResNet-20, 100 clients, memory budgets uniformly distributed as the widths a client
could train end to end, r in {1/6, 1/3, 1/2, 1} ("Fair", a quarter of the clients each), Dirichlet(1.0)
label skew (second column of Table 2: the milder of its two Dirichlet columns, as 25 rounds of a stronger
skew order noise), 500 rounds, 10 local epochs, SGD lr 0.1, batch 128. Here: ResNet-20
on Fashion-MNIST (offline), 10 clients per round, and group r's budget is the cost model's predicted peak of
training the width-r model end to end (batch 32), so every method gets the same memory and finds its own
fit (FeDepth its block decomposition, DepthFL its depth, HeteroFL its width, the small model the narrowest
group's width). Unconstrained full-width FedAvg is the ceiling ("Unrealistic FedAvg x1"). Paper order: Table 2,
Fair, CIFAR-10 alpha(1.0), restricted to the methods edgefl has (SplitMix and m-FeDepth it has not).
Settings are fixed here, before any run.

Validate:  python bench/reproduce_fedepth.py --rounds 2 --train-limit 2000 --test-limit 500 -o /tmp/fedepth.json
Full run:  python bench/reproduce_fedepth.py          (defaults below; split with --only and --merge)
Converged: python bench/reproduce_fedepth.py --column to-convergence --seed S --state DIR [--only M]   (300 rounds,
           hours: resumable from DIR; `--merge` a seed's parts, `--combine` the seeds)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduction import Run, Study, convergence_column, group_fleet, main, peak_bytes  # noqa: E402

WIDTHS = {"r1/6": 1 / 6, "r1/3": 1 / 3, "r1/2": 1 / 2, "r1": 1.0}


def runs(args, ref) -> list[Run]:
    per = 100 // len(WIDTHS)
    fleet = group_fleet("fedepth-fair", [(g.replace("/", "_"), per, peak_bytes(ref, args.runtime, head_start=0, head_width=r))
                                         for g, r in WIDTHS.items()], args.runtime)
    ceiling = group_fleet("fedepth-ceiling", [("all", 100, peak_bytes(ref, args.runtime))], args.runtime)
    return [*[Run(m, m, fleet) for m in ("fedepth", "depthfl", "heterofl", "small")],
            Run("fedavg", "fedavg", ceiling, ceiling=True)]


SETTINGS = {"rounds": 25, "partition": "dirichlet:1", "train_limit": 20000, "test_limit": 5000,
            "eval_every": 5, "lr": 0.05, "lr_final": 0.005, "batch_size": 32, "local_epochs": 1,
            "optimizer": "sgd (momentum 0.9, weight decay 1e-5)", "budget_widths": list(WIDTHS)}

STUDY = Study(
    name="fedepth",
    paper={"source": "FeDepth (seed paper 003), Table 2 (PreResNet-20, balanced non-iid), Fair budgets, "
                     "CIFAR-10 alpha(1.0) column",
           "accuracy": {"fedepth": 64.95, "heterofl": 60.48, "depthfl": 58.55, "small": 53.10, "fedavg": 69.77,
                        "m-fedepth (not in edgefl)": 65.49, "splitmix (not in edgefl)": 58.70},
           "alpha_0.3_column": {"fedepth": 60.62, "depthfl": 58.52, "heterofl": 56.35, "small": 47.66, "fedavg": 63.44},
           "setting": "100 clients, budgets r in {1/6,1/3,1/2,1} a quarter each, Dirichlet 1.0, 500 rounds, "
                      "10 local epochs, SGD lr 0.1 cosine, batch 128, mean of 5 runs"},
    settings=SETTINGS,
    paper_order=["fedepth", "heterofl", "depthfl", "small"],
    runs=runs, columns={"to-convergence": convergence_column("fedepth", SETTINGS)})

if __name__ == "__main__":
    main(STUDY, __doc__.splitlines()[0])
