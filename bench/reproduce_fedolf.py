"""FedOLF's Table 1 setting (seed paper 004) on edgefl's emulation: ordered layer freezing, with and without TOA.

The paper (sec. 5.1): 100 clients, 10 per round, iid (Table 2; Table 1 is Dirichlet(0.1)), five
equal client clusters that freeze {4, 3, 2, 1, 0} layers of ResNet-20, 500 rounds, 5 local epochs, SGD. Here
the clusters are memory budgets: cluster k's budget is the cost model's predicted peak of training ResNet-20
with its first k layers frozen (batch 32), so FedOLF's planner lands on the paper's prefixes and every other
method gets the same memory and finds its own fit (a width for FD/FjORD/HeteroFL, exits for DepthFL, a step
schedule for SLT). Fashion-MNIST instead of CIFAR-100 (offline), ResNet-20 as the paper's CIFAR-100 column.
iid, not the paper's main Dirichlet(0.1): at 25 rounds a Dirichlet(0.1) run's accuracy swings by more than
10 points between evaluations (FedOLF: 0.33 at round 20, 0.22 at 25), so a final accuracy orders noise;
`--partition dirichlet:0.1` runs the main table's setting when rounds allow.
TOA keeps s = 0.75 and 0.5 of each frozen layer's filters (the paper's two rows). Unconstrained FedAvg (every
budget fits the full model) is the ceiling. Paper order: Table 2, CIFAR-100 / ResNet-20 column, restricted
to the methods edgefl has (CoCoFL it has not). Settings are fixed here, before any run.

Validate:  python bench/reproduce_fedolf.py --rounds 2 --train-limit 2000 --test-limit 500 -o /tmp/fedolf.json
Full run:  python bench/reproduce_fedolf.py          (defaults below; split with --only and --merge)
Non-iid:   python bench/reproduce_fedolf.py --partition dirichlet:0.1 -o bench/results/reproduce_fedolf_dirichlet.json
           (compared with the paper's Table 1)
MNIST:     python bench/reproduce_fedolf.py --data mnist -o bench/results/reproduce_fedolf_mnist.json
Converged: python bench/reproduce_fedolf.py --column to-convergence --seed S --state DIR [--only M]   (300 rounds,
           hours: resumable from DIR; `--merge` a seed's parts, `--combine` the seeds)
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduction import Run, Study, convergence_column, group_fleet, main, peak_bytes  # noqa: E402

FROZEN = (4, 3, 2, 1, 0)


def runs(args, ref) -> list[Run]:
    per = 100 // len(FROZEN)
    fleet = group_fleet("fedolf", [(f"freeze{k}", per, peak_bytes(ref, args.runtime, frozen_prefix=k)) for k in FROZEN],
                        args.runtime)
    ceiling = group_fleet("fedolf-ceiling", [("all", 100, peak_bytes(ref, args.runtime))], args.runtime)
    return [Run("fedolf", "fedolf", fleet), Run("fedolf+toa0.75", "fedolf", fleet, {"toa": 0.75}),
            Run("fedolf+toa0.5", "fedolf", fleet, {"toa": 0.5}),
            *[Run(m, m, fleet) for m in ("slt", "depthfl", "fd", "fjord", "heterofl")],
            Run("fedavg", "fedavg", ceiling, ceiling=True)]


SETTINGS = {"rounds": 25, "partition": "iid", "train_limit": 20000, "test_limit": 5000,
            "eval_every": 5, "lr": 0.05, "lr_final": 0.005, "batch_size": 32, "local_epochs": 1,
            "optimizer": "sgd (momentum 0.9, weight decay 1e-5)", "clusters_frozen_layers": list(FROZEN)}

STUDY = Study(
    name="fedolf",
    paper={"source": "FedOLF (seed paper 004), Table 2 (iid, T = 500, appendix C.3), CIFAR-100 / ResNet-20 column",
           "accuracy": {"fedolf": 48.49, "slt": 45.80, "fedolf+toa0.75": 40.49, "fedolf+toa0.5": 36.19,
                        "fjord": 11.14, "heterofl": 7.02, "fd": 6.05, "depthfl": 5.05, "fedavg": 51.11,
                        "cocofl (not in edgefl)": 26.95},
           "setting": "100 clients, 10 per round, iid, 5 clusters freezing {4,3,2,1,0} layers, "
                      "500 rounds, 5 local epochs, SGD lr 0.01, batch 128, mean of 3 trials"},
    settings=SETTINGS,
    paper_order=["fedolf", "slt", "fedolf+toa0.75", "fedolf+toa0.5", "fjord", "heterofl", "fd", "depthfl"],
    runs=runs, columns={"to-convergence": convergence_column("fedolf", SETTINGS)},
    non_iid={"source": "FedOLF (seed paper 004), Table 1 (Dirichlet(0.1), T = 500), CIFAR-100 / ResNet-20 column",
             "accuracy": {"fedolf": 37.85, "fedolf+toa0.75": 36.04, "slt": 25.04, "fedolf+toa0.5": 24.93,
                          "depthfl": 24.87, "fd": 17.02, "fjord": 12.7, "heterofl": 12.32, "fedavg": 46.01},
             "order": ["fedolf", "fedolf+toa0.75", "slt", "fedolf+toa0.5", "depthfl", "fd", "fjord", "heterofl"]})

if __name__ == "__main__":
    main(STUDY, __doc__.splitlines()[0])
