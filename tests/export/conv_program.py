"""Run by tests/export/test_native_conv.py in a process of its own: the training program of one step (`argv[1]`:
a folder holding program.pte, weights.ptd and inputs.npz) in ExecuTorch's Python bindings, with edgefl's kernels
registered as the Python ExecuTorch trainer registers them (`argv[2]` "edgefl") or the shipped ones alone
("shipped"), at `argv[3]` threads, batch statistics switched to `argv[4]` (1 to train, 0 to evaluate; BN running
statistics from inputs.npz's stat<i>); writes outputs.npz (loss, logits, updated statistics and gradients in
the program's order) and prints how many convolution, max pool and batch norm calls edgefl's kernels served."""
import json
import sys
from pathlib import Path

import numpy as np
import torch
from executorch.extension.pybindings import portable_lib as et

from edgefl.device_runtime.trainers import executorch_trainer

folder, kernels, threads = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
switch = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
et._unsafe_reset_threadpool(threads)
if kernels == "edgefl":
    assert executorch_trainer._edgefl_kernels().startswith("edgefl ")
program = et._load_program(str(folder / "program.pte"), data_path=str(folder / "weights.ptd"))
method = program.load_method("forward")
names = list(program.load_method("__et_training_fqn_forward").call([]))
inputs = np.load(folder / "inputs.npz")
stats = [torch.from_numpy(inputs[f"stat{i}"]) for i in range(sum(k.startswith("stat") for k in inputs.files))]
outs = method.call([torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["y"]), torch.tensor(switch), *stats])
grads = outs[2 + len(stats):2 + len(stats) + len(names)]
np.savez(folder / f"outputs-{kernels}-{threads}-{switch:g}.npz", loss=outs[0].numpy(), logits=outs[1].numpy(),
         **{f"updated{i}": s.numpy() for i, s in enumerate(outs[2:2 + len(stats)])},
         **{name: g.numpy() for name, g in zip(names, grads, strict=True)})
served = {op: executorch_trainer.edgefl_kernel_calls(op) if kernels == "edgefl" else 0
          for op in ("convolution", "convolution_backward", "max_pool2d", "max_pool2d_backward", "batch_norm",
                     "batch_norm_backward")}
print(json.dumps(served))
