"""edgefl's convolution, max pool and batch norm kernels (device_runtime/native/src/kernels_conv.cpp, kernels_pool.cpp,
kernels_norm.cpp)
against torch's autograd, each on one training program that covers what the kernels serve.

Batch norm (edgefl::batch_norm, kernels_norm.cpp): with batch statistics (the running ones updated) and with
running statistics. Convolutions: padding, stride 2 without a bias, a 1x1 (its input is its own patch matrix), dilation 2, a
rectangular kernel with uneven stride and padding, and a first convolution whose input gradient the program does
not want (an output the kernel must leave alone). The stride-1 ones run as shifted-row products (gemm_rows.cpp),
their input gradients as convolutions; the 16-channel one's weight gradient too (whole vectors of channels). Max pools: 2x2, 3x3 with stride 2 and padding, dilation 2, ceil
mode, on an input with many ties (rounded values after a ReLU: whole windows of zeros), where torch routes the
gradient to the first maximum in scan order. A program runs in ExecuTorch's Python bindings with
libedgefl_et_kernels.so registered (as the Python ExecuTorch trainer runs it) at 1 and 2 threads, the convolutions
also on the shipped kernels alone (direct loops; the shipped pool backward adds into an unzeroed buffer, so pools
have no shipped run): loss, logits and every gradient within 1e-5 of torch's (a gradient routed to another
element of a tie would be off by its whole value), and edgefl's kernels served every call."""
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
                                   nn.Conv2d(6, 16, 3, padding=1), nn.ReLU(),
                                   nn.Conv2d(16, 5, 3, padding=2, dilation=2), nn.ReLU(),
                                   nn.Conv2d(5, 4, (3, 2), stride=(2, 1), padding=(0, 1)))
        self.fc = nn.Linear(4 * 2 * 6, 10)

    def forward(self, x, y):
        logits = self.fc(self.convs(x).flatten(1))
        return nn.functional.cross_entropy(logits, y), logits


class Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1, 3, 11, 13))      # x * 1: the input's ties survive
        self.pools = nn.ModuleList([nn.MaxPool2d(2), nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, 1, 0, 2),
                                    nn.MaxPool2d(2, ceil_mode=True)])  # 6x7: a last row and column of part windows
        self.fc = nn.Linear(3 * (5 * 6 + 6 * 7 + 9 * 11 + 6 * 7), 10)

    def forward(self, x, y):
        h = torch.relu(x * self.scale)
        logits = self.fc(torch.cat([pool(h).flatten(1) for pool in self.pools], 1))
        return nn.functional.cross_entropy(logits, y), logits


def run_program(model, x, y, folder, runs, switch: float = 1.0):
    """The program's outputs per (kernels, threads) in `runs`, each checked against torch's autograd (BN in train
    mode with `switch` 1, eval mode with 0); what edgefl's kernels served in each run."""
    from edgefl.export.executorch_program import PREFIX, training_program

    exported = training_program(model, (x, y))
    (folder / "program.pte").write_bytes(exported.program)
    (folder / "weights.ptd").write_bytes(exported.weights)
    start = [model.state_dict()[name].clone() for name in exported.statistics]
    np.savez(folder / "inputs.npz", x=x.numpy(), y=y.numpy(), **{f"stat{i}": s.numpy() for i, s in enumerate(start)})
    loss, logits = model.train(bool(switch))(x, y)
    loss.backward()
    expected = {"loss": loss.detach().numpy(), "logits": logits.detach().numpy(),
                **{PREFIX + name: p.grad.numpy() for name, p in model.named_parameters()},
                # the running statistics after a training step (an evaluation's are ignored by the trainer)
                **({f"updated{i}": model.state_dict()[name].numpy() for i, name in enumerate(exported.statistics)}
                   if switch else {})}
    served = {}
    for kernels, threads in runs:
        proc = subprocess.run([sys.executable, str(RUNNER), str(folder), kernels, str(threads), f"{switch:g}"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        served[kernels, threads] = json.loads(proc.stdout.strip().splitlines()[-1])
        outputs = np.load(folder / f"outputs-{kernels}-{threads}-{switch:g}.npz")
        compared = [f for f in outputs.files if switch or not f.startswith("updated")]
        assert sorted(compared) == sorted(expected), outputs.files
        for name, value in expected.items():
            assert rel(outputs[name], value) <= 1e-5, (kernels, threads, name, rel(outputs[name], value))
    return served


def test_convolution_kernels_match_torch(native_trainer, tmp_path):
    torch.manual_seed(0)
    x, y = torch.randn(5, 3, 9, 9), torch.randint(0, 10, (5,))
    served = run_program(Convs(), x, y, tmp_path, (("edgefl", 1), ("edgefl", 2), ("shipped", 1)))
    # six convolutions; the first one's backward computes no input gradient
    for (kernels, _), calls in served.items():
        assert calls == ({"convolution": 6, "convolution_backward": 6, "max_pool2d": 0, "max_pool2d_backward": 0,
                          "batch_norm": 0, "batch_norm_backward": 0}
                         if kernels == "edgefl" else dict.fromkeys(calls, 0)), (kernels, calls)


def test_max_pool_kernels_route_gradients_like_torch(native_trainer, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(4, 3, 11, 13, generator=torch.Generator().manual_seed(0)).round()    # many ties
    y = torch.randint(0, 10, (4,))
    assert (nn.functional.max_pool2d(torch.relu(x), 2) == 0).sum() >= 10, "too few all-zero windows: ties untested"
    served = run_program(Pools(), x, y, tmp_path, (("edgefl", 1), ("edgefl", 2)))
    for calls in served.values():
        assert calls == {"convolution": 0, "convolution_backward": 0, "max_pool2d": 4, "max_pool2d_backward": 4,
                         "batch_norm": 0, "batch_norm_backward": 0}, calls


class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                                   nn.Conv2d(4, 6, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(6, momentum=0.3))
        self.fc = nn.Linear(6 * 4 * 5, 10)
        for bn in (self.convs[1], self.convs[4]):       # nothing at its default: a swapped term would show
            bn.weight.data.uniform_(0.5, 1.5), bn.bias.data.uniform_(-0.5, 0.5)
            bn.running_mean.uniform_(-0.5, 0.5), bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x, y):
        logits = self.fc(torch.relu(self.convs(x)).flatten(1))
        return nn.functional.cross_entropy(logits, y), logits


@pytest.mark.parametrize("switch", [1.0, 0.0], ids=["batch-statistics", "running-statistics"])
def test_batch_norm_kernels_match_torch(native_trainer, tmp_path, switch):
    """edgefl::batch_norm and its backward (kernels_norm.cpp) against torch's BatchNorm2d: in train mode (batch
    statistics, the running ones updated with the unbiased variance) at 1 and 2 threads, and in eval mode (the
    running statistics, as the trainer evaluates through the training program)."""
    torch.manual_seed(0)
    x, y = torch.randn(5, 3, 7, 9) * 3 + 1, torch.randint(0, 10, (5,))
    served = run_program(Norms(), x, y, tmp_path, (("edgefl", 1), ("edgefl", 2)), switch)
    for calls in served.values():
        assert calls["batch_norm"] == calls["batch_norm_backward"] == 2, calls
