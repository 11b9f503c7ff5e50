"""Summarise a pretrained set that `edgefl pretrain -o DIR` wrote: per depth its losses, steps and validation
curve (and, for a set continued with `--from`, the earlier stages), its settings, and whether the held-out
and validation losses fall strictly with depth (CAFF's premise: a deeper pretrained model is a better one).

Run:  python bench/pretrained_set.py DIR -o bench/results/reproduce_caff_pretrained_dropout.json \\
          --command "edgefl pretrain -o DIR ..."
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefl.data import pretrain_corpus  # noqa: E402
from edgefl.errors import EdgeflError  # noqa: E402
from edgefl.zoo.pretrained import available, pretrained_plays  # noqa: E402

PER_DEPTH = ("held_out_loss", "validation_loss", "best_step", "train_loss", "first_loss", "steps", "params",
             "seconds", "validation_curve", "total_steps", "stages")


def strictly_decreasing(values: list) -> bool:
    return None not in values and all(a > b for a, b in zip(values, values[1:]))


BLOCK = 20   # consecutive test windows per block: neighbouring passages share a scene, so single windows are not independent


def paired_difference(deeper: np.ndarray, shallower: np.ndarray) -> dict:
    """How far a deeper model's loss is below a shallower one's on the same windows, with the standard error
    of that mean taken over blocks of BLOCK consecutive windows (a gap under two standard errors is not resolved
    by this test text)."""
    gain = shallower - deeper
    blocks = gain[: len(gain) // BLOCK * BLOCK].reshape(-1, BLOCK).mean(axis=1)
    if len(blocks) < 2:
        raise SystemExit(f"the test text has {len(gain)} windows: a standard error needs at least {2 * BLOCK}")
    error = float(blocks.std(ddof=1) / np.sqrt(len(blocks)))
    mean = float(gain.mean())
    return {"loss_gain": mean, "standard_error": error, "windows_deeper_better": float((gain > 0).mean()),
            "resolved": abs(mean) > 2 * error}


def every_test_window(folder: Path, configs: dict, tokens) -> dict:
    """Each depth's loss over every window of the test text, not only the `eval_windows` first ones that
    `held_out_loss` measures, and each step in depth as a paired difference on those windows: how much of a
    difference between depths is the passages measured."""
    import torch

    from edgefl.zoo import ModelRef, build
    from edgefl.zoo.pretrain import split, window_losses
    from edgefl.zoo.pretrained import load_pretrained

    losses, result = {}, {}
    for depth, config in sorted(configs.items()):
        settings = config["settings"]
        test = split(tokens, settings["holdout"])[2]
        ref = ModelRef.from_json(config["model"])
        model = build(ref)
        model.load_state_dict(load_pretrained(folder, ref))
        losses[depth] = window_losses(model, test, settings["context"], torch.device("cpu"), windows=len(test))
        result[str(depth)] = {"windows": len(losses[depth]), "held_out_loss": float(losses[depth].mean())}
    depths = sorted(losses)
    result["steps_in_depth"] = {f"{a}->{b}": paired_difference(losses[b], losses[a]) for a, b in zip(depths, depths[1:])}
    return result


def summary(folder: Path, all_windows: bool = False) -> dict:
    """The set in `folder` as one JSON object; every depth must share the settings but `layers`."""
    configs = available(folder)
    settings = {json.dumps(c["settings"], sort_keys=True) for c in configs.values()}
    if len(settings) != 1:
        raise SystemExit(f"{folder}: its depths were pretrained with different settings; summarise one set at a time")
    first = next(iter(configs.values()))
    depths = {str(d): {k: c[k] for k in PER_DEPTH if k in c} for d, c in sorted(configs.items())}
    tokens = pretrain_corpus(holdout=pretrained_plays(folder)).tokens
    return {"settings": first["settings"], "corpus": first["corpus"], "corpus_tokens": len(tokens),
            "works": first["works"],
            "split": f"the corpus's last {first['settings']['holdout']:.0%}: its first half is the validation text "
                     "(chooses the checkpoint), its second half the test text (held_out_loss; never used to choose)",
            "depths": depths,
            "held_out_loss_strictly_decreasing_with_depth":
                strictly_decreasing([v["held_out_loss"] for v in depths.values()]),
            "validation_loss_strictly_decreasing_with_depth":
                strictly_decreasing([v["validation_loss"] for v in depths.values()]),
            **({"every_test_window": every_test_window(folder, configs, tokens)} if all_windows else {})}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the set 'edgefl pretrain -o DIR' wrote")
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--command", default="", help="the command that wrote the set, recorded as given")
    p.add_argument("--note", default="", help="what the run's wall times mean (other jobs on the machine, ...)")
    p.add_argument("--all-windows", action="store_true",
                   help="also measure each depth on every window of the test text (every_test_window)")
    args = p.parse_args(argv)
    try:
        result = summary(args.folder, args.all_windows)
    except EdgeflError as exc:
        raise SystemExit(str(exc)) from None
    result = {"command": args.command, **({"seconds_note": args.note} if args.note else {}), **result}
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    losses = " / ".join(f"{v['held_out_loss']:.3f}" for v in result["depths"].values())
    print(f"held-out loss {losses} for {' / '.join(result['depths'])} layers; strictly decreasing: "
          f"{result['held_out_loss_strictly_decreasing_with_depth']} -> {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
