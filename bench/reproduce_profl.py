"""ProFL's comparison (seed paper 002) on edgefl's emulation, to convergence: progressive training under random budgets.

The paper (sec. 4.1): 100 devices, 20 sampled per round, memory drawn at random in 100-900 MB "while
considering resource contention", so that a minority can train the full model (ExclusiveFL's participation:
8% for ResNet18, 24% for VGG11_bn), Dirichlet(1) for non-iid; each method scored as "the average accuracy of
the last 10 rounds after convergence" (Table 1), ProFL allowed up to T times the rounds of end-to-end training
(sec. 3.4). Two columns, on Fashion-MNIST (offline; no registry package ships CIFAR-10's files):
- resnet (default): the ResNet18 CIFAR-10 iid column, whose numbers survive only in the text (ProFL ahead of
  AllSmall by 7.4 points, HeteroFL 8.6, DepthFL 13.7, ExclusiveFL 18.8), on edgefl's ResNet-20, iid, 8% of
  the devices fitting the whole model; T = 3 residual stages, 300 rounds (FedAvg plateaus near 100 here).
- vgg11bn: Table 2's CIFAR-10 non-iid VGG11_bn column, Dirichlet(1), 24% fitting the whole model, ProFL with
  T = 2 blocks (its first four convolutions and its last four, sec. 4.1), 200 rounds; the images are
  zero-padded to 32x32 (edgefl's VGG-11 pools five times; the paper's pools every two convolutions and
  averages what is left, a departure in the model, not the method).
Budgets: ten groups of ten devices at the deciles of a uniform draw between ProFL's smallest step (the output
layer alone) and the point where the column's share fits the whole model. Methods: ProFL, ExclusiveFL,
AllSmall (edgefl's small model), HeteroFL, DepthFL; unconstrained FedAvg is the ceiling (the paper reports
none). Evidence runs, not ordered with those: DepthFL with half the fleet below its smallest model
(`depthfl-half`, the ResNet column) and ProFL with even steps (`profl-even-steps`, `ProFL(switch="schedule")`,
both columns).
Rounds, epochs, batch and learning rate are not in the paper: ours are SLT's bench settings. Every round of the
last 10 is evaluated; `converged` is judged by bench/reproduction.last_rounds, fixed before any
run. Settings are fixed here, before any run.

Validate:  python bench/reproduce_profl.py --rounds 12 --train-limit 2000 --test-limit 500 -o /tmp/profl.json
Full run:  python bench/reproduce_profl.py [--column vgg11bn] --seed S --state DIR -o F   (hours: run it in
           pieces, each resumed from DIR; split with --only and --merge)
On a GPU:  add --device cuda (recorded in the settings: a GPU run is never merged with CPU runs). Run a few
           processes per GPU, not one per run: 26 runs sharing one H200 ran ResNet-20 rounds in 13-19 s (ExclusiveFL's
           few clients: 3 s), slower than one CPU core here (ProFL: 10.8 s), the GPU time-slicing between the
           processes at 99% "utilisation".
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduction import Run, Study, group_fleet, main, peak_bytes  # noqa: E402

GROUPS = 10
# devices that fit the whole model: ExclusiveFL's participation in the paper (ResNet18 8%, VGG11_bn 24%)
RESNET_SHARE, VGG_SHARE = 0.08, 0.24


def output_layer_peak(ref, runtime: str) -> int:
    """ProFL's smallest step, the output layer alone: the floor of a column's budget range."""
    from edgefl.planning.strategies import PlanContext
    layers = PlanContext(group_fleet("probe", [("p", 1, 2**40)], runtime), ref).num_layers
    return peak_bytes(ref, runtime, frozen_prefix=layers - 1)


def budgets(ref, runtime: str, full_share: float) -> list[int]:
    low = output_layer_peak(ref, runtime)
    full = peak_bytes(ref, runtime)
    high = low + (full - low) / (1 - full_share)          # P(budget >= full) = full_share under U[low, high]
    return [int(low + (high - low) * (i + 0.5) / GROUPS) for i in range(GROUPS)]


EVIDENCE = ("depthfl-half", "profl-even-steps")


def runs_with(profl_options: dict, full_share: float, evidence: tuple[str, ...] = ()):
    """A column's runs: its budgets put `full_share` of the devices above the whole model's peak. `evidence`
    names runs that test why ProFL is not first here (not ordered with the paper's methods): `depthfl-half`,
    DepthFL with the lower half of the fleet below its smallest model (50% participation, the paper's
    ResNet18 setting has 47%), and `profl-even-steps`, ProFL with each step given its even share of the rounds
    instead of ending when its block's movement flattens."""
    def runs(args, ref) -> list[Run]:
        levels = budgets(ref, args.runtime, full_share)
        fleet = group_fleet("profl", [(f"b{i}", 100 // GROUPS, b) for i, b in enumerate(levels)], args.runtime)
        ceiling = group_fleet("profl-ceiling", [("all", 100, peak_bytes(ref, args.runtime))], args.runtime)
        paper_runs = [Run("profl", "profl", fleet, options=profl_options),
                      *[Run(m, m, fleet) for m in ("depthfl", "exclusive", "heterofl", "small")],
                      Run("fedavg", "fedavg", ceiling, ceiling=True)]
        extra = []
        if "depthfl-half" in evidence:
            # the lower half at the range's floor, ProFL's output layer alone: below DepthFL's first block + exit
            floor = output_layer_peak(ref, args.runtime)
            half = group_fleet("profl-half", [(f"b{i}", 100 // GROUPS, floor if i < GROUPS // 2 else b)
                                              for i, b in enumerate(levels)], args.runtime)
            extra.append(Run("depthfl-half", "depthfl", half, evidence=True))
        if "profl-even-steps" in evidence:
            extra.append(Run("profl-even-steps", "profl", fleet, evidence=True,
                             options={**profl_options, "switch": "schedule"}))
        return [*paper_runs, *extra]
    return runs


SETTINGS = {"partition": "iid", "train_limit": 20000, "test_limit": 5000, "eval_every": 5, "lr": 0.05,
            "lr_final": 0.005, "batch_size": 32, "local_epochs": 1, "optimizer": "sgd (momentum 0.9, weight decay "
            "1e-5)", "budget_groups": GROUPS}
VGG11 = {
    "name": "profl_vgg11bn", "model": "vgg11bn", "input_shape": (1, 32, 32), "runs": runs_with({"blocks": 2}, VGG_SHARE, evidence=("profl-even-steps",)),
    "paper": {"source": "ProFL (seed paper 002), Table 2, CIFAR-10 non-iid, VGG11_bn column",
              "accuracy": {"profl": 85.4, "depthfl": 83.4, "exclusive": 81.1, "heterofl": 78.2, "small": 75.3},
              "participation": {"profl": 1.0, "depthfl": 0.43, "exclusive": 0.24, "heterofl": 1.0, "small": 1.0},
              "setting": "100 devices, 20 per round, memory random in 100-900 MB, Dirichlet 1; rounds, epochs, "
                         "batch and learning rate not stated"},
    "settings": {**SETTINGS, "rounds": 200, "partition": "dirichlet:1", "full_model_share": VGG_SHARE, "blocks": 2},
    "paper_order": ["profl", "depthfl", "exclusive", "heterofl", "small"]}

STUDY = Study(
    name="profl_resnet",
    paper={"source": "ProFL (seed paper 002), sec. 4.2 text on Table 1, ResNet18, CIFAR-10 iid (the table's "
                     "body is missing from the paper's conversion)",
           "ahead_by_points": {"small": 7.4, "heterofl": 8.6, "depthfl": 13.7, "exclusive": 18.8},
           "participation": {"profl": 1.0, "depthfl": 0.47, "exclusive": 0.08, "heterofl": 1.0, "small": 1.0},
           "setting": "100 devices, 20 per round, memory random in 100-900 MB, iid; rounds, epochs, batch and "
                      "learning rate not stated"},
    settings={**SETTINGS, "rounds": 300, "full_model_share": RESNET_SHARE, "blocks": 3},
    paper_order=["profl", "small", "heterofl", "depthfl", "exclusive"],
    runs=runs_with({}, RESNET_SHARE, evidence=EVIDENCE), clients_per_round=20, score_last=10, columns={"vgg11bn": VGG11}, column="resnet")

if __name__ == "__main__":
    main(STUDY, __doc__.splitlines()[0])
