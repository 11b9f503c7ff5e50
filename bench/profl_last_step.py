"""What moves ProFL's accuracy within its last step: a reading of finished runs, no training.

ProFL's last step in the VGG column swings by 1-4 points from one evaluation to the next where the other
methods move by tenths (docs/reproductions.md). This reads the state folders `bench/reproduce_profl.py --state
DIR` leaves (one per run: `history.json`, the last round's weights) and tests candidate causes:
- the draw: the last step's evaluations, their deviation from a cubic trend in the round, and its correlation
  with the share of the round's draw that trains only the output layer (the groups the plan gives that step,
  sec. 4.1) and with the draw's label skew (total variation of its examples' label mix from uniform, over the
  whole draw and over the block trainers alone); the deviation's size against the number of block trainers;
- batch norm: the last round's model evaluated with its averaged running statistics and with HeteroFL's static
  ones (edgefl.server.global_model), the same 2,048 of the devices' examples the emulation would use;
- runs that draw the same clients (`--same-draw A,B`: ProFL and its even-steps run share a pool in the last
  step): the correlation of their round-to-round changes over the last 10 rounds.

Usage: python bench/profl_last_step.py --column vgg11bn LABEL:SEED=DIR ... [--same-draw "LABEL:SEED,LABEL:SEED"]
           -o bench/results/profl_last_step_vgg11bn.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reproduce_profl import STUDY  # noqa: E402
from reproduction import padded  # noqa: E402

from edgefl.data import load_dataset, parse_partition, subset  # noqa: E402
from edgefl.planning.strategies import STRATEGIES, PlanContext  # noqa: E402
from edgefl.planning.strategies.profl import OUTPUT_LAYER  # noqa: E402
from edgefl.zoo import ModelRef  # noqa: E402


def column_setting(column: str) -> dict:
    study = STUDY.columns.get(column, {}) if column != STUDY.column else {}
    return {"model": study.get("model", STUDY.model), "input_shape": study.get("input_shape", STUDY.input_shape),
            "settings": study.get("settings", STUDY.settings), "runs": study.get("runs", STUDY.runs)}


def output_layer_groups(run, ref: ModelRef, rounds: int, batch_size: int) -> set[str]:
    """The groups that afford no block and train the output layer alone, as the run's plan says."""
    strategy = run.strategy()
    strategy = STRATEGIES[strategy]() if isinstance(strategy, str) else strategy
    planned = strategy.plan(PlanContext(run.fleet, ref, rounds=rounds, batch_size=batch_size))
    return {name for name, g in planned.groups.items() if g.steps and all(s.label.endswith(OUTPUT_LAYER) for s in g.steps)}


def skew(counts: np.ndarray) -> float:
    p = counts / counts.sum()
    return float(0.5 * np.abs(p - 1 / len(p)).sum())


def correlation(a, b) -> float | None:
    """Over the rows where both are defined (a draw of output-layer devices alone has no block trainers)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    defined = ~np.isnan(a) & ~np.isnan(b)
    a, b = a[defined], b[defined]
    return None if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0 else round(float(np.corrcoef(a, b)[0, 1]), 3)


def last_step(history: list[dict], output_only: set[str], labels_of: dict[str, np.ndarray]) -> dict:
    label = history[-1]["decisions"]["step_label"]
    first = next(r["round"] for r in history if r["decisions"].get("step_label") == label)
    rows = []
    for r in history:
        if r["round"] < first or r["accuracy"] is None:
            continue
        drawn = list(r["sampled"])
        blocks = [d for d in drawn if r["sampled"][d] not in output_only]
        rows.append((r["round"], r["accuracy"], (len(drawn) - len(blocks)) / len(drawn),
                     skew(sum(labels_of[d] for d in drawn)),
                     skew(sum(labels_of[d] for d in blocks)) if blocks else np.nan))
    a = np.array(rows)
    residual = a[:, 1] - np.polyval(np.polyfit(a[:, 0], a[:, 1], 3), a[:, 0])
    return {"step": label, "first_round": first, "evaluations": len(rows),
            "residual_std_points": round(float(residual.std()) * 100, 2),
            "correlation_with_residual": {"output_layer_share": correlation(residual, a[:, 2]),
                                          "label_skew_draw": correlation(residual, a[:, 3]),
                                          "label_skew_block_trainers": correlation(residual, a[:, 4])},
            # fewer devices training the block would widen the deviation either way, not shift it
            "abs_residual_vs_block_trainers": correlation(np.abs(residual), 1 - a[:, 2]),
            "last_10": [[int(r), acc] for r, acc in a[-10:, :2]],
            "last_10_draws": [sorted(r["sampled"]) for r in history[-10:]]}


def batch_norm(folder: Path, ref: ModelRef, test, bn_examples: np.ndarray, batch_size: int, seed: int) -> dict:
    """The last round's model with its running statistics and with static ones (the whole model: ProFL's last
    step ends in the classifier, so its output modules are not part of it)."""
    import torch

    from edgefl.engines.local import torch_trainer
    from edgefl.server.global_model import TorchServerModel
    torch.set_num_threads(1)
    state = json.loads((folder / "checkpoint.json").read_text())
    weights = {k: v for k, v in np.load(folder / state["weights"]).items() if not k.startswith("aux.")}
    trainer, out = torch_trainer(ref, "cpu"), {"round": state["round"]}
    for name, static in (("running_statistics", None), ("static_statistics", (bn_examples, batch_size))):
        server = TorchServerModel(ref, test, trainer, seed, static_bn=static)
        server.restore(weights)
        out[name] = server.evaluate()["accuracy"]
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="LABEL:SEED=DIR: the state folder of the study's run LABEL (profl, "
                   "profl-even-steps) at SEED")
    p.add_argument("--column", default=STUDY.column, choices=[STUDY.column, *STUDY.columns])
    p.add_argument("--same-draw", action="append", default=[],
                   help="LABEL:SEED,LABEL:SEED: two of the runs, checked to draw the same clients in their last 10 rounds")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args(argv)
    setting = column_setting(args.column)
    settings, ref = setting["settings"], ModelRef.of(setting["model"], num_classes=10, input_shape=setting["input_shape"])
    runs = {r.label: r for r in setting["runs"](argparse.Namespace(runtime="ort"), ref)}
    from edgefl.engines.local import static_bn_rows
    result = {"column": args.column, "settings": settings, "runs": {}}
    train_set, test_set = load_dataset("fashion-mnist", split="train"), load_dataset("fashion-mnist", split="test")
    for spec in args.runs:
        name, _, folder = spec.partition("=")
        label, _, seed = name.partition(":")
        if label not in runs or not seed.isdigit() or not (Path(folder) / "history.json").exists():
            raise SystemExit(f"{spec}: expected LABEL:SEED=DIR, LABEL one of {sorted(runs)} and DIR a run's state "
                             "folder (history.json in it)")
        seed, folder = int(seed), Path(folder)
        train = padded(subset(train_set, settings["train_limit"], seed), setting["input_shape"])
        test = padded(subset(test_set, settings["test_limit"], seed + 1), setting["input_shape"])
        shares = parse_partition(settings["partition"]).split(train.y, STUDY.devices, seed)
        devices = sorted(d for g in runs[label].fleet.groups for d in g.device_ids)
        labels_of = {d: np.bincount(train.y[s], minlength=10) for d, s in zip(devices, shares, strict=True)}
        history = json.loads((folder / "history.json").read_text())["rounds"]
        output_only = output_layer_groups(runs[label], ref, settings["rounds"], settings["batch_size"])
        result["runs"][name] = {"label": label, "seed": seed, "output_layer_groups": sorted(output_only),
                                "last_step": last_step(history, output_only, labels_of),
                                "batch_norm": batch_norm(folder, ref, test, train.x[static_bn_rows(shares, seed)],
                                                          settings["batch_size"], seed)}
        print(name, json.dumps(result["runs"][name]["last_step"]["correlation_with_residual"]),
              json.dumps(result["runs"][name]["batch_norm"]), flush=True)
    result["same_draw"] = {}
    for pair in args.same_draw:
        first, second = (result["runs"][n]["last_step"] for n in pair.split(","))
        if first["last_10_draws"] != second["last_10_draws"]:
            raise SystemExit(f"--same-draw {pair}: the runs draw other clients in their last 10 rounds")
        a, b = (np.array([acc for _, acc in step["last_10"]]) for step in (first, second))
        result["same_draw"][pair] = {"round_to_round_correlation": correlation(np.diff(a), np.diff(b))}
    args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
