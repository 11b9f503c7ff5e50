"""edgefl's convolution kernels (device_runtime/native/src/kernels_conv.cpp) against torch's autograd, on one
training program whose convolutions cover what the kernels serve: padding, stride 2 without a bias, a 1x1 (its
input is its own patch matrix), dilation 2, a rectangular kernel with uneven stride and padding, and a first
convolution whose input gradient the program does not want (an output the kernel must leave alone). The program
runs in ExecuTorch's Python bindings with libedgefl_et_kernels.so registered (as the Python ExecuTorch trainer
runs it) at 1 and 2 threads, and on the shipped kernels alone (direct loops): loss, logits and every gradient
within 1e-5 of torch's, and edgefl's kernels served every convolution and its backward."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_cases import EXPORTS, available
from test_native_trainer import rel
from torch import nn

pytestmark = [EXPORTS, pytest.mark.skipif(not available("executorch"), reason="executorch is not installed")]
RUNNER = Path(__file__).with_name("conv_program.py")


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(),
                                   nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False), nn.ReLU(),
                                   nn.Conv2d(6, 6, 1), nn.ReLU(),
                                   nn.Conv2d(6, 5, 3, padding=2, dilation=2), nn.ReLU(),
                                   nn.Conv2d(5, 4, (3, 2), stride=(2, 1), padding=(0, 1)))
        self.fc = nn.Linear(4 * 2 * 6, 10)

    def forward(self, x, y):
        logits = self.fc(self.convs(x).flatten(1))
        return nn.functional.cross_entropy(logits, y), logits


def test_convolution_kernels_match_torch(native_trainer, tmp_path):
    from edgefl.export.executorch_program import PREFIX, training_program

    torch.manual_seed(0)
    model = Convs()
    x, y = torch.randn(5, 3, 9, 9), torch.randint(0, 10, (5,))
    exported = training_program(model, (x, y))
    (tmp_path / "program.pte").write_bytes(exported.program)
    (tmp_path / "weights.ptd").write_bytes(exported.weights)
    np.savez(tmp_path / "inputs.npz", x=x.numpy(), y=y.numpy())
    loss, logits = model(x, y)
    loss.backward()
    expected = {"loss": loss.detach().numpy(), "logits": logits.detach().numpy(),
                **{PREFIX + name: p.grad.numpy() for name, p in model.named_parameters()}}
    for kernels, threads in (("edgefl", 1), ("edgefl", 2), ("shipped", 1)):
        proc = subprocess.run([sys.executable, str(RUNNER), str(tmp_path), kernels, str(threads)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        served = json.loads(proc.stdout.strip().splitlines()[-1])
        # five convolutions; the first one's backward computes no input gradient
        assert served == ({"convolution": 5, "convolution_backward": 5} if kernels == "edgefl" else
                          {"convolution": 0, "convolution_backward": 0}), (kernels, served)
        outputs = np.load(tmp_path / f"outputs-{kernels}-{threads}.npz")
        assert sorted(outputs.files) == sorted(expected), outputs.files
        for name, value in expected.items():
            assert rel(outputs[name], value) <= 1e-5, (kernels, threads, name, rel(outputs[name], value))
