"""Export-friendly forms of the layers ExecuTorch trains badly, each with its layer's exact state_dict.

ExecuTorch's addmm kernel (and its backward) is a naive loop. Written as the ops its runtime runs fast
(matrix products), the same layers train an order of magnitude faster. Convolutions and max pools stay
`nn.Conv2d` and `nn.MaxPool2d`: the programs hold aten.convolution, aten.max_pool2d_with_indices and their
backward, which edgefl's kernels serve (device_runtime/native/src/kernels_conv.cpp, kernels_pool.cpp, in the
native trainer and, through libedgefl_et_kernels.so, in the Python ExecuTorch trainer). They used to be
rewritten here, as the shipped convolution kernels are direct loops (seconds per ResNet-20 step) and the shipped
pool backward adds into a gradient buffer it never zeroes: convolutions as shifted slices, concatenations and
batched products (a patch matrix k*k times the input in the program's memory plan), pools as a max over a
permuted reshape (two input-sized copies each way).

* `MatmulLinear`: x @ W^T + b as one matrix product (addmm's training kernel is the slow one), transposing
  the smaller of input and weight.
* `TiledAvgPool2d`: average pooling over tiling windows as a mean over a reshape (no avg_pool2d backward).
* `StatBatchNorm2d`: batch norm as edgefl's fused operator in training (edgefl.export.et_ops; written out of
  mean/var/rsqrt in evaluation mode). In training its running statistics are values, not buffers mutated in
  place: it reads them from its buffers (which the exporter replaces by
  program inputs) and leaves the updated ones in `updates`, which the exporter returns as outputs. That
  sidesteps the three traps of train-mode BN in an ExecuTorch training program: no out variant for the
  functional batch-norm op, mutated buffers starting from zero instead of their initial values, and
  gradient outputs mis-sliced by the stock TrainingModule when buffers mutate. A scalar input chooses
  batch or running statistics, so the training program evaluates too (no second program, no second
  memory plan on the device).

Matrix products are written as large `bmm`/`mm`s, each one GEMM in edgefl's kernels, and
transposes as `permute` (edgefl.export.executorch_program moves them onto the smaller operand). No
parameter is ever reshaped directly: ExecuTorch's emitter cannot place a view of an external weight (an
unsqueeze is a copy there).

`rewrite(module)` returns a deep copy with every such layer replaced; `load_state_dict` of the original
state loads into it unchanged.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from edgefl.export.et_ops import batch_norm


class MatmulLinear(nn.Module):
    """nn.Linear as one matrix product (addmm's training kernel is the slow one), written so that what gets
    transposed is the smaller of the weight and the input: a transpose is a copy in ExecuTorch, and a copy
    of a large weight lives from the forward step to the backward step (a CNN's 6 MB fc weight, twice)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cout, cin = self.weight.shape
        rows = x.numel() // cin
        if cout > rows:     # out^T = W x^T: the input and the output are transposed, never the weight
            out = torch.mm(self.weight, x.reshape(rows, cin).permute(1, 0)).permute(1, 0)
        else:
            out = torch.bmm(x.reshape(1, rows, cin), self.weight.t().reshape(1, cin, cout))
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], cout)


class StatBatchNorm2d(nn.Module):
    """nn.BatchNorm2d (affine, tracked statistics) with its running statistics updated out of place.

    In train mode it normalises with `batch_statistics` * batch statistics + (1 - `batch_statistics`) *
    running statistics: 1 (the default) is torch's train mode exactly (x * 1 and x + 0 are exact), 0 its
    eval mode, so one training program also evaluates (the exporter feeds both as inputs)."""

    def __init__(self, bn: nn.BatchNorm2d):
        super().__init__()
        self.weight, self.bias = bn.weight, bn.bias
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked)
        self.register_buffer("batch_statistics", torch.ones(()), persistent=False)
        self.eps, self.momentum = bn.eps, bn.momentum
        self.updates: tuple[torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def supports(bn: nn.BatchNorm2d) -> bool:
        return bn.affine and bn.track_running_stats and bn.momentum is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            y, self.updates = batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                                         self.batch_statistics, self.momentum, self.eps)
            return y
        scale = torch.rsqrt(self.running_var + self.eps) * self.weight
        bias = self.bias.unsqueeze(-1).unsqueeze(-1)     # a copy, not a view of the weight (module docstring)
        return (x - self.running_mean.reshape(1, -1, 1, 1)) * scale.reshape(1, -1, 1, 1) + bias


class TiledAvgPool2d(nn.Module):
    """nn.AvgPool2d whose windows tile the input (kernel = stride, no padding: a DenseNet transition) as a
    mean over a reshape. ExecuTorch's kernels have no avg_pool2d backward, and ONNX Runtime 1.19's
    AveragePoolGrad kills the process with a floating-point exception (edgefl.export.ort_backend uses it
    too); a mean's backward is an expand in both."""

    def __init__(self, pool: nn.AvgPool2d):
        super().__init__()
        self.k = pool.kernel_size

    @staticmethod
    def supports(pool: nn.AvgPool2d) -> bool:
        return (isinstance(pool.kernel_size, int) and pool.stride in (pool.kernel_size, None) and pool.padding == 0
                and not pool.ceil_mode and pool.divisor_override is None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        k = self.k
        if (h % k, w % k) != (0, 0):        # floor mode drops the last rows and columns
            x = x[:, :, : h - h % k, : w - w % k]
        return x.reshape(n, c, h // k, k, w // k, k).mean(dim=(3, 5))


def _replacement(mod: nn.Module) -> nn.Module | None:
    if type(mod) is nn.Linear:
        return MatmulLinear(mod)
    if type(mod) is nn.BatchNorm2d and StatBatchNorm2d.supports(mod):
        return StatBatchNorm2d(mod)
    if type(mod) is nn.AvgPool2d and TiledAvgPool2d.supports(mod):
        return TiledAvgPool2d(mod)
    return None


def rewrite(module: nn.Module) -> nn.Module:
    """A deep copy of `module` with its linears, batch norms and pools in export-friendly form."""
    out = copy.deepcopy(module)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            new = _replacement(child)
            if new is not None:
                new.train(child.training)
                setattr(parent, name, new)
    return out


def batch_norms(module: nn.Module) -> list[tuple[str, StatBatchNorm2d]]:
    """The rewritten batch norms of `module` with their qualified names, in module order."""
    return [(name, m) for name, m in module.named_modules() if isinstance(m, StatBatchNorm2d)]
