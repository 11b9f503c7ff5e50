"""A lean FedAvg loop: the practical limit of a single-process emulation.

Data as in-memory arrays, one model object, no framework: per round, each scheduled client loads the
global weights into the one model, trains on its partition (fedbench.task.train, the same loop the
Flower clients run), and the weighted mean of the returned weights (weights = example counts, summed in
float64) becomes the new global state. Run by bench/emulate_vs_flower.py in a subprocess:

    python bench/lean_fedavg.py --data D.npz --schedule S.json --initial I.npz --out O.json

It writes wall-clock times (time.time()) of each round's start and end, and the final test accuracy.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "flower_app"))
from fedbench import task  # noqa: E402


def fedavg(model: torch.nn.Module, data: dict, schedule: dict, batch_size: int, epochs: int) -> dict:
    times = {"round_start": [], "round_end": []}
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    for plan in schedule["rounds"]:
        times["round_start"].append(time.time())
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in global_state.items()}
        examples = 0
        for client, seed in zip(plan["clients"], plan["seeds"], strict=True):
            idx = data["partitions"][client]
            model.load_state_dict(global_state)
            task.train(model, data["x"][idx], data["y"][idx], plan["lr"], seed, epochs, batch_size)
            for k, v in model.state_dict().items():
                total[k] += len(idx) * v.double()
            examples += len(idx)
        global_state = {k: (v / examples).to(global_state[k].dtype) for k, v in total.items()}
        times["round_end"].append(time.time())
    model.load_state_dict(global_state)
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--data", "--schedule", "--initial", "--out"):
        p.add_argument(name, required=True)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--local-epochs", type=int, default=1)
    args = p.parse_args(argv)
    data = task.load(args.data)
    schedule = json.loads(Path(args.schedule).read_text())
    model = task.cnn()
    model.load_state_dict(task.initial_state(args.initial, model))
    times = fedavg(model, data, schedule, args.batch_size, args.local_epochs)
    metrics = task.evaluate(model, data["x_test"], data["y_test"])
    times["round_end"][-1] = time.time()   # the other systems' last round includes the final evaluation
    Path(args.out).write_text(json.dumps({**times, **metrics, "rounds": len(schedule["rounds"])}))


if __name__ == "__main__":
    main()
