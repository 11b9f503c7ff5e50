"""ProFL's main-table setting (seed paper 002) on edgefl's emulation: progressive training under random budgets.

The paper (sec. 4.1): 100 devices, 20 sampled per round, memory drawn at random in 100-900 MB "while
considering resource contention", so that a minority can train the full model (ExclusiveFL's participation:
24% for VGG11_bn, 8% for ResNet18), Dirichlet(1) for non-iid. Here: ResNet-20 on Fashion-MNIST (offline),
ten groups of ten devices whose budgets are the deciles of a uniform draw between the smallest ProFL step
(the output layer alone: every layer but the head frozen) and the point where 24% of devices fit the whole
model, as in its VGG-11 table. Methods: ProFL, ExclusiveFL, AllSmall (edgefl's small model), HeteroFL,
DepthFL; unconstrained FedAvg is the ceiling (the paper reports none). Paper order: Table 2, CIFAR-10
non-iid VGG11_bn column (the ResNet table did not survive the paper's conversion). The paper gives no
rounds, epochs, batch or learning rate: ours are SLT's bench settings. Settings are fixed here, before any run.

Validate:  python bench/reproduce_profl.py --rounds 2 --train-limit 2000 --test-limit 500 -o /tmp/profl.json
Full run:  python bench/reproduce_profl.py          (defaults below; split with --only and --merge)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduction import Run, Study, group_fleet, main, peak_bytes  # noqa: E402

FULL_SHARE = 0.24        # devices that fit the whole model (ExclusiveFL's participation, ProFL Table 2, VGG11)
GROUPS = 10


def budgets(ref, runtime: str) -> list[int]:
    from edgefl.planning.strategies import PlanContext
    layers = PlanContext(group_fleet("probe", [("p", 1, 2**40)], runtime), ref).num_layers
    low = peak_bytes(ref, runtime, frozen_prefix=layers - 1)
    full = peak_bytes(ref, runtime)
    high = low + (full - low) / (1 - FULL_SHARE)          # P(budget >= full) = FULL_SHARE under U[low, high]
    return [int(low + (high - low) * (i + 0.5) / GROUPS) for i in range(GROUPS)]


def runs(args, ref) -> list[Run]:
    fleet = group_fleet("profl", [(f"b{i}", 100 // GROUPS, b) for i, b in enumerate(budgets(ref, args.runtime))],
                        args.runtime)
    ceiling = group_fleet("profl-ceiling", [("all", 100, peak_bytes(ref, args.runtime))], args.runtime)
    return [*[Run(m, m, fleet) for m in ("profl", "depthfl", "exclusive", "heterofl", "small")],
            Run("fedavg", "fedavg", ceiling, ceiling=True)]


STUDY = Study(
    name="profl",
    paper={"source": "ProFL (seed paper 002), Table 2, CIFAR-10 non-iid, VGG11_bn column",
           "accuracy": {"profl": 85.4, "depthfl": 83.4, "exclusive": 81.1, "heterofl": 78.2, "small": 75.3},
           "participation": {"profl": 1.0, "depthfl": 0.43, "exclusive": 0.24, "heterofl": 1.0, "small": 1.0},
           "setting": "100 devices, 20 per round, memory random in 100-900 MB, Dirichlet 1; rounds, epochs, "
                      "batch and learning rate not stated"},
    settings={"rounds": 25, "partition": "dirichlet:1", "train_limit": 20000, "test_limit": 5000,
              "eval_every": 5, "lr": 0.05, "lr_final": 0.005, "batch_size": 32, "local_epochs": 1,
              "optimizer": "sgd (momentum 0.9, weight decay 1e-5)", "full_model_share": FULL_SHARE,
              "budget_groups": GROUPS},
    paper_order=["profl", "depthfl", "exclusive", "heterofl", "small"],
    runs=runs, clients_per_round=20)

if __name__ == "__main__":
    main(STUDY, __doc__.splitlines()[0])
