"""Export-friendly forms of the layers ExecuTorch trains badly, each with its layer's exact state_dict.

ExecuTorch's portable convolution and addmm kernels (and their backward) are naive loops: a ResNet-20
suffix took seconds per step (RUNTIME_NOTES). Written as the ops its runtime runs fast (slicing, `cat`,
matrix products), the same layers train an order of magnitude faster:

* `MatmulConv2d`: channels-last, zero padding by `cat` (F.pad's backward crashed the runtime), the k*k
  shifted strided slices stacked along channels (im2col without an im2col kernel), a batched matrix
  product with the weight laid out (kh, kw, in, out), a few samples at a time (`PATCH_BYTES`): the patch
  matrix is k*k times the input, and a whole batch's of it was most of a program's memory plan.
* `MatmulLinear`: x @ W^T + b as one matrix product (addmm's training kernel is the slow one), transposing
  the smaller of input and weight.
* `SliceMaxPool2d`: max pooling as a max over stacked window slices (a reshape where windows tile the
  input): the runtime's own pool backward returns wrong gradients (its docstring).
* `TiledAvgPool2d`: average pooling over tiling windows as a mean over a reshape (no avg_pool2d backward).
* `StatBatchNorm2d`: batch norm written out of mean/var/rsqrt. In training its running statistics are
  values, not buffers mutated in place: it reads them from its buffers (which the exporter replaces by
  program inputs) and leaves the updated ones in `updates`, which the exporter returns as outputs. That
  sidesteps the three traps of train-mode BN in an ExecuTorch training program: no out variant for the
  functional batch-norm op, mutated buffers starting from zero instead of their initial values, and
  gradient outputs mis-sliced by the stock TrainingModule when buffers mutate. A scalar input chooses
  batch or running statistics, so the training program evaluates too (no second program, no second
  memory plan on the device).

Matrix products are written as large `bmm`/`mm`s, which the optimized kernels run at full speed, and
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


def _pair(v) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else tuple(v)


def _pad_channels_last(x: torch.Tensor, ph: int, pw: int, value: float = 0.0) -> torch.Tensor:
    """Constant padding of an (N, H, W, C) tensor by concatenation (F.pad's backward crashed the runtime)."""
    n, h, w, c = x.shape
    if ph:
        rows = x.new_full((n, ph, w, c), value)
        x = torch.cat([rows, x, rows], dim=1)
    if pw:
        cols = x.new_full((n, h + 2 * ph, pw, c), value)
        x = torch.cat([cols, x, cols], dim=2)
    return x


def _shifts(x: torch.Tensor, dim: int, k: int, stride: int, size: int) -> torch.Tensor:
    """The k strided windows of `size` positions along `dim`, side by side along the last (channel) axis."""
    index = (slice(None),) * dim
    windows = [x[index + (slice(i, i + stride * (size - 1) + 1, stride),)] for i in range(k)]
    return windows[0] if k == 1 else torch.cat(windows, dim=-1)


# most bytes of one convolution's patch matrix built at once (MatmulConv2d). Each chunk costs graph nodes
# (export time, and runtime metadata per instruction) and its patches cost arena memory: at 2 MiB a full
# ResNet-20 suffix plans 55 MiB (4 MiB: 60; 1 MiB: 52) and exports in about 2 minutes (4 MiB: 1; 1 MiB: 4)
PATCH_BYTES = 2 * 2**20


class MatmulConv2d(nn.Module):
    """nn.Conv2d (groups 1, dilation 1, zero padding): channels-last shifted slices + one batched product.

    Channels-last makes the shifted slices stack along the contiguous axis, so the patch matrix
    (N*Ho*Wo, kh*kw*Cin) needs no transpose; only the input and output change layout."""

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        self.weight = conv.weight
        self.bias = conv.bias
        self.kernel, self.stride = _pair(conv.kernel_size), _pair(conv.stride)
        self.padding = _pair(conv.padding)

    @staticmethod
    def supports(conv: nn.Conv2d) -> bool:
        return (conv.groups == 1 and _pair(conv.dilation) == (1, 1) and conv.padding_mode == "zeros"
                and not isinstance(conv.padding, str))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (kh, kw), (sh, sw), (ph, pw) = self.kernel, self.stride, self.padding
        n, c, h, w = x.shape
        ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
        cout = self.weight.shape[0]
        # permute first: a view of the weight itself trips the emitter on external weights
        weight = self.weight.permute(2, 3, 1, 0).reshape(1, kh * kw * c, cout)
        # the patch matrix is kh*kw times the input: built for a few samples at a time, the program's memory
        # plan holds one chunk's patches (and their backward's), not the batch's
        rows = max(1, min(n, PATCH_BYTES // (ho * wo * kh * kw * c * x.element_size())))
        parts = [self._product(part, weight, ho, wo) for part in (torch.split(x, rows) if rows < n else (x,))]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(n, ho, wo, cout).permute(0, 3, 1, 2)

    def _product(self, x: torch.Tensor, weight: torch.Tensor, ho: int, wo: int) -> torch.Tensor:
        """(1, rows * ho * wo, out channels): the convolution of NCHW samples `x`, before the bias."""
        (kh, kw), (sh, sw) = self.kernel, self.stride
        x = _pad_channels_last(x.permute(0, 2, 3, 1), *self.padding)
        n, c = x.shape[0], x.shape[3]
        # im2col in two passes (kw shifts along W, then kh along H): 2k slices instead of k*k, a third
        # fewer graph nodes with the backward, and exporting costs time per node
        cols = _shifts(x, 2, kw, sw, wo)                                           # (n, h, wo, kw*c)
        cols = _shifts(cols, 1, kh, sh, ho)                                        # (n, ho, wo, kh*kw*c)
        return torch.bmm(cols.reshape(1, n * ho * wo, kh * kw * c), weight)


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
        mean, var = self.running_mean, self.running_var
        if not self.training:
            centred = x - mean.reshape(1, -1, 1, 1)
        else:
            batch_mean = x.mean(dim=(0, 2, 3))
            t = self.batch_statistics
            mean = t * batch_mean + (1 - t) * mean
            # one centred tensor serves the batch variance and the output, so the backward keeps one copy
            # of the input's size per BN (as torch does), not two: with t = 1 it is x - batch_mean exactly;
            # with t = 0 (evaluation) the batch variance it gives is wrong but weighs 0
            centred = x - mean.reshape(1, -1, 1, 1)
            batch_var = (centred * centred).mean(dim=(0, 2, 3))
            n, m = x.numel() // x.shape[1], self.momentum
            # torch updates the running variance with the unbiased batch variance
            self.updates = ((1 - m) * self.running_mean + m * batch_mean.detach(),
                            (1 - m) * var + m * batch_var.detach() * (n / max(n - 1, 1)))
            var = t * batch_var + (1 - t) * var
        scale = torch.rsqrt(var + self.eps) * self.weight
        bias = self.bias.unsqueeze(-1).unsqueeze(-1)     # a copy, not a view of the weight (module docstring)
        return centred * scale.reshape(1, -1, 1, 1) + bias


class SliceMaxPool2d(nn.Module):
    """nn.MaxPool2d (floor mode) as the max over its k*k strided window slices, stacked on a last axis.

    ExecuTorch's portable max_pool2d_with_indices_backward scatter-adds into a gradient buffer it never
    zeroes (pytorch/executorch#21686, fixed after the pinned release): every convolution before a pool
    then trains on stale arena bytes. A max over a stacked axis has a backward that scatters into fresh
    zeros. Windows are stacked in the pool's scan order and `max` keeps the first of equal values, so
    ties route the gradient where torch's pool routes it."""

    def __init__(self, pool: nn.MaxPool2d):
        super().__init__()
        self.kernel = _pair(pool.kernel_size)
        self.stride = _pair(pool.stride if pool.stride is not None else pool.kernel_size)
        self.padding, self.dilation = _pair(pool.padding), _pair(pool.dilation)

    @staticmethod
    def supports(pool: nn.MaxPool2d) -> bool:
        return not pool.ceil_mode and not pool.return_indices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (kh, kw), (sh, sw), (ph, pw), (dh, dw) = self.kernel, self.stride, self.padding, self.dilation
        if (kh, kw) == (sh, sw) and not ph and not pw and (dh, dw) == (1, 1):
            return self._tiled(x)
        if ph or pw:          # padded positions are never the maximum (-inf), as in torch's pool
            x = _pad_channels_last(x.permute(0, 2, 3, 1), ph, pw, float("-inf")).permute(0, 3, 1, 2)
        h, w = x.shape[2:]
        ho, wo = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
        windows = [x[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
                   for i in range(kh) for j in range(kw)]
        return torch.stack(windows, dim=-1).max(dim=-1).values

    def _tiled(self, x: torch.Tensor) -> torch.Tensor:
        """Windows that tile the input (kernel = stride, the usual 2x2 pool): a reshape puts each window on a
        last axis in scan order, so the backward scatters into one input-sized buffer, where stacked slices
        scatter into one per window position (k*k input-sized buffers, summed)."""
        (kh, kw) = self.kernel
        n, c, h, w = x.shape
        ho, wo = h // kh, w // kw
        if (ho * kh, wo * kw) != (h, w):     # floor mode drops the last rows and columns
            x = x[:, :, :ho * kh, :wo * kw]
        windows = x.reshape(n, c, ho, kh, wo, kw).permute(0, 1, 2, 4, 3, 5).reshape(n, c, ho, wo, kh * kw)
        return windows.max(dim=-1).values


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
    if type(mod) is nn.Conv2d and MatmulConv2d.supports(mod):
        return MatmulConv2d(mod)
    if type(mod) is nn.Linear:
        return MatmulLinear(mod)
    if type(mod) is nn.BatchNorm2d and StatBatchNorm2d.supports(mod):
        return StatBatchNorm2d(mod)
    if type(mod) is nn.AvgPool2d and TiledAvgPool2d.supports(mod):
        return TiledAvgPool2d(mod)
    if type(mod) is nn.MaxPool2d:
        if not SliceMaxPool2d.supports(mod):    # the runtime's own pool would train on garbage gradients
            raise NotImplementedError(f"ExecuTorch training of {mod} (ceil mode or returned indices)")
        return SliceMaxPool2d(mod)
    return None


def rewrite(module: nn.Module) -> nn.Module:
    """A deep copy of `module` with its convolutions, linears and batch norms in export-friendly form."""
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
