"""The training process of one round: load an artifact set, train it on the device's data, write the trained
tensors, print what it measured. Started fresh for every round by the agent (`edgefl.device_runtime.child`),
so its peak RSS (VmHWM) is the training's own and nothing of a previous round stays resident.

Local data is read a batch at a time (edgefl.device_runtime.local_data), so the peak does not grow with
the device's share. Local training matches the emulation's torch Trainer
(edgefl.device_runtime.trainers.torch_trainer) batch for batch, so a run served to devices and the same run
emulated reach the same weights: `local_epochs` passes, each over a fresh permutation from numpy's
default_rng(seed), cut to the instruction's `max_examples` (the examples the plan's FLOPs assume), in
batches of the manifest's batch size, the last batch of a pass the remainder (unless that is one example:
edgefl.trainconfig.pass_batches).

    python -m edgefl.device_runtime.worker '{"artifacts": DIR, "data": PATH, "lr": 0.05, "seed": 7,
                                              "epochs": 1, "threads": 1, "out": FILE.npy,
                                              "max_examples": 400 (optional)}'
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def train(spec: dict) -> dict:
    from edgefl.device_runtime.local_data import load_data
    from edgefl.device_runtime.peaks import vm_status
    from edgefl.device_runtime.trainers.base import open_trainer
    from edgefl.trainconfig import pass_batches

    t0 = time.perf_counter()
    trainer = open_trainer(spec["artifacts"], spec.get("runtime"), threads=spec.get("threads", 1))
    x, y = load_data(Path(spec["data"]), trainer.artifacts)
    rng = np.random.default_rng(spec["seed"])
    losses = []
    # the plan's FLOPs assume `max_examples` per pass: a device holding more trains on that many, drawn anew
    used = min(len(x), spec.get("max_examples") or len(x))
    # a runtime whose training program has a fixed batch size skips a pass's smaller remainder
    whole = used - used % trainer.batch_size if getattr(trainer, "exact_batch", False) else used
    for _ in range(spec.get("epochs", 1)):
        order = rng.permutation(len(x))[:used]
        for start in pass_batches(whole, trainer.batch_size):
            idx = order[start:start + trainer.batch_size]
            losses.append(float(trainer.train_step(x[idx], np.asarray(y[idx], np.int64).reshape(-1), spec["lr"])))
    upload_bytes = trainer.write_upload(spec["out"])
    return {"runtime": trainer.runtime, "steps": len(losses), "examples": used, "batch_size": trainer.batch_size,
            "data_read": "batch",      # load_data reads a batch at a time (edgefl.device_runtime.local_data)
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "upload_bytes": upload_bytes, "peak_rss_bytes": vm_status("VmHWM"),
            "wall_s": time.perf_counter() - t0,
            "torch_loaded": sys.modules.get("torch") is not None}


def main(argv: list[str]) -> int:
    from edgefl.device_runtime.child import child_main

    spec = json.loads(argv[0])
    return child_main(lambda: train(spec), spec.get("runtime"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
