"""edgefl's own ExecuTorch operators: batch norm in training and its backward, each one fused kernel.

Written out of means, products and sums (the exporter's earlier form), a BatchNorm2d was about a dozen
elementwise passes and half a dozen reductions over its input each step, each an input-sized tensor of the
program's memory plan. As two operators, `edgefl::batch_norm` and `edgefl::batch_norm_backward`, the joint graph
holds one call each way; autograd pairs them here (`register_autograd`), and ExecuTorch plans their `.out`
forms like any aten operator's. device_runtime/native/src/kernels_norm.cpp serves both, in the native trainer
and, through libedgefl_et_kernels.so, in the Python ExecuTorch trainer; the torch implementation below (the
same arithmetic, in torch's operators) is what tracing and the exporter's own check of the logits run.

    batch_norm(x, weight, bias, running_mean, running_var, t, momentum, eps)
        -> (y, save_mean, save_invstd, new_running_mean, new_running_var)

`t` (float32 scalar) is 1 to normalise with the batch's statistics, 0 with the running ones
(et_rewrites.StatBatchNorm2d: one program trains and evaluates); t * batch + (1 - t) * running is exact for
both. The running statistics' update is torch's (momentum, the variance unbiased); the gradient flows to x,
weight and bias only.
"""
from __future__ import annotations

import torch

_FORWARD = ("Tensor x, Tensor weight, Tensor bias, Tensor running_mean, Tensor running_var, Tensor t, "
            "float momentum, float eps")
_FORWARD_OUT = ("Tensor(a!) y, Tensor(b!) save_mean, Tensor(c!) save_invstd, Tensor(d!) new_mean, "
                "Tensor(e!) new_var")
_BACKWARD = "Tensor grad, Tensor x, Tensor weight, Tensor save_mean, Tensor save_invstd, Tensor t"
_BACKWARD_OUT = "Tensor(a!) grad_x, Tensor(b!) grad_weight, Tensor(c!) grad_bias"


def _per_channel(v: torch.Tensor) -> torch.Tensor:
    return v.reshape(1, -1, 1, 1)


def batch_norm_reference(x, weight, bias, running_mean, running_var, t, momentum: float, eps: float):
    n = x.numel() // x.shape[1]
    batch_mean = x.mean(dim=(0, 2, 3))
    mean = t * batch_mean + (1 - t) * running_mean
    centred = x - _per_channel(mean)
    batch_var = (centred * centred).mean(dim=(0, 2, 3))
    invstd = torch.rsqrt(t * batch_var + (1 - t) * running_var + eps)
    y = centred * _per_channel(invstd * weight) + _per_channel(bias)
    return (y, mean, invstd, (1 - momentum) * running_mean + momentum * batch_mean,
            (1 - momentum) * running_var + momentum * (batch_var * (n / max(n - 1, 1))))


def batch_norm_backward_reference(grad, x, weight, save_mean, save_invstd, t):
    n = x.numel() // x.shape[1]
    xhat = (x - _per_channel(save_mean)) * _per_channel(save_invstd)
    grad_bias = grad.sum(dim=(0, 2, 3))
    grad_weight = (grad * xhat).sum(dim=(0, 2, 3))
    scale = weight * save_invstd
    grad_x = (_per_channel(scale) * grad - _per_channel(t * scale * (grad_bias / n))
              - xhat * _per_channel(t * scale * (grad_weight / n)))
    return grad_x, grad_weight, grad_bias


def _define() -> None:
    lib = torch.library.Library("edgefl", "FRAGMENT")
    lib.define(f"batch_norm({_FORWARD}) -> (Tensor, Tensor, Tensor, Tensor, Tensor)")
    lib.define(f"batch_norm.out({_FORWARD}, *, {_FORWARD_OUT}) -> "
               "(Tensor(a!), Tensor(b!), Tensor(c!), Tensor(d!), Tensor(e!))")
    lib.define(f"batch_norm_backward({_BACKWARD}) -> (Tensor, Tensor, Tensor)")
    lib.define(f"batch_norm_backward.out({_BACKWARD}, *, {_BACKWARD_OUT}) -> (Tensor(a!), Tensor(b!), Tensor(c!))")

    def written(outs, values):
        for out, value in zip(outs, values, strict=True):
            out.copy_(value)
        return outs

    lib.impl("batch_norm", lambda *a: tuple(v.clone() for v in batch_norm_reference(*a)), "CompositeExplicitAutograd")
    lib.impl("batch_norm.out", lambda *a, y, save_mean, save_invstd, new_mean, new_var: written(
        (y, save_mean, save_invstd, new_mean, new_var), batch_norm_reference(*a)), "CompositeExplicitAutograd")
    lib.impl("batch_norm_backward", lambda *a: tuple(v.clone() for v in batch_norm_backward_reference(*a)),
             "CompositeExplicitAutograd")
    lib.impl("batch_norm_backward.out", lambda *a, grad_x, grad_weight, grad_bias: written(
        (grad_x, grad_weight, grad_bias), batch_norm_backward_reference(*a)), "CompositeExplicitAutograd")

    @torch.library.register_fake("edgefl::batch_norm", lib=lib)
    def _(x, weight, bias, running_mean, running_var, t, momentum, eps):
        channel = x.new_empty(x.shape[1])
        return x.new_empty(x.shape), channel, channel.new_empty(channel.shape), channel.new_empty(channel.shape), \
            channel.new_empty(channel.shape)

    @torch.library.register_fake("edgefl::batch_norm_backward", lib=lib)
    def _(grad, x, weight, save_mean, save_invstd, t):
        return grad.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape)

    def setup_context(ctx, inputs, output):
        x, weight, _, _, _, t, _, _ = inputs
        _, save_mean, save_invstd, _, _ = output
        ctx.save_for_backward(x, weight, save_mean, save_invstd, t)
        ctx.mark_non_differentiable(*output[1:])

    def backward(ctx, grad, *_):
        x, weight, save_mean, save_invstd, t = ctx.saved_tensors
        grad_x, grad_weight, grad_bias = torch.ops.edgefl.batch_norm_backward(grad, x, weight, save_mean, save_invstd, t)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None

    torch.library.register_autograd("edgefl::batch_norm", backward, setup_context=setup_context, lib=lib)
    _LIBRARIES.append(lib)      # a Library deregisters its operators when collected


_LIBRARIES: list = []
if not hasattr(torch.ops.edgefl, "batch_norm"):
    _define()


def batch_norm(x, weight, bias, running_mean, running_var, t, momentum: float, eps: float):
    """(y, (new running mean, new running var)): edgefl::batch_norm, its statistics detached."""
    y, _, _, new_mean, new_var = torch.ops.edgefl.batch_norm(x, weight, bias, running_mean, running_var, t,
                                                             momentum, eps)
    return y, (new_mean, new_var)
