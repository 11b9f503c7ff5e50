"""ProFL's output modules on the global state (ProFL sec. 3.2): the "Map" and composed output modules.

The output module after block t is theta_op = [theta_{t+1,Conv}, ..., theta_{T,Conv}, theta_L]: one conv per
later block, each distilled from that block during progressive model shrinking, then the classifier theta_L.
Every module is built from the same pieces, so the pieces carry over from one step to the next: the conv of
a later block and theta_L are trained with the block of each step and handed, as trained, to the next
step's module. In edgefl an output module is the conv auxiliary head at the block's end (`aux.<b>.conv.`):
one conv per architectural stage after b, then pool + linear (edgefl.zoo); the conv of block t is the
head's convs of the stages inside block t, and theta_L of the whole model is its classifier layer.

`compose(state, ref, change, x)` makes the next step's module (the `OutputModuleChange` a strategy asks
for): its convs of stages both modules share and its linear are copied from the module the last step
trained (or from the model's classifier when that step ended there); with `mapped`, the convs of the block
the last step trained are distilled from it ("Map": knowledge distillation, sec. 3.2): on inputs `x`
carried to the block's start by the frozen blocks before it, the convs learn to reproduce the block's output
features (mean squared error). The paper does not give the distillation's data, loss or schedule: edgefl
distils on the server, on the seeded sample of the devices' data the emulation holds for per-group
accuracy, with Adam (lr MAP_LR) for MAP_STEPS batches of MAP_BATCH examples, then batch-norm statistics of the
whole sample; a server without such data
(deployment) composes the module without the map and says so in the round's decisions.
"""
from __future__ import annotations

from typing import Mapping, Optional, cast

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from edgefl.planning.strategies.profl import OutputModuleChange
from edgefl.server.submodel import ensure_aux
from edgefl.trainconfig import TrainConfig, aux_key
from edgefl.zoo import ModelRef, build
from edgefl.zoo.base import LayeredModel

MAP_STEPS, MAP_BATCH, MAP_LR = 300, 64, 1e-2


def _layout(model: LayeredModel, boundary: int) -> tuple[list[int], str]:
    """(the stage ends the head at `boundary` holds a conv for, in its order; the key prefix of its linear
    inside it). Its convs stand for the first stages after the boundary (a stage of no convs, the CNN's
    dense layers, has none); a head that is one linear layer holds no conv."""
    head = model.aux_head(boundary, "conv")
    if not isinstance(head, nn.Sequential):
        return [], ""
    n = len(head) - 1
    return [e for e in list(model.stages)[1:] if e > boundary][:n], f"{n}."


def _module(state: Mapping[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def _classifier(state: Mapping[str, torch.Tensor], L: int) -> list[str]:
    return [k for k in state if k.startswith(f"layers.{L - 1}.")]


def _copy_linear(state: dict, src: list[str], dst: list[str]) -> bool:
    """Copy a linear layer's weight and bias where their shapes agree (VGG's flattening classifier agrees with
    the head's pooled one only on a 1 x 1 map)."""
    if len(src) != len(dst) or any(state[a].shape != state[b].shape for a, b in zip(src, dst, strict=True)):
        return False
    for a, b in zip(src, dst, strict=True):
        state[b] = state[a].clone()
    return True


def compose(state: Mapping[str, torch.Tensor], ref: ModelRef, change: OutputModuleChange,
            x: Optional[np.ndarray], seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """The global state with the next step's output module composed (and mapped); what was done, for the
    round's decisions."""
    with torch.random.fork_rng(devices=[]):     # built for their shapes: leave the global stream be
        return _compose(state, ref, change, x, seed)


def _compose(state: Mapping[str, torch.Tensor], ref: ModelRef, change: OutputModuleChange,
             x: Optional[np.ndarray], seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    model = cast(LayeredModel, build(ref))
    L = len(model.layers)
    state = dict(state)
    for end in (change.from_end, change.to_end):
        if end < L:
            state = ensure_aux(state, ref, [TrainConfig(num_layers=L, frozen_prefix=end, trained_end=end,
                                                        aux_head="conv")])
    done: dict = {"composed_from": change.from_end, "composed_to": change.to_end}
    src, dst = aux_key(change.from_end, "conv"), aux_key(change.to_end, "conv")
    (old, old_linear), (new, new_linear) = ((_layout(model, e) if e < L else ([], "")) for e in
                                            (change.from_end, change.to_end))
    linear_src = (_classifier(state, L) if change.from_end == L else
                  sorted(k for k in state if k.startswith(src + old_linear)))
    linear_dst = (_classifier(state, L) if change.to_end == L else
                  sorted(k for k in state if k.startswith(dst + new_linear)))
    done["linear_carried"] = _copy_linear(state, sorted(linear_src), sorted(linear_dst))
    if change.to_end < L and change.from_end < L:
        for e in set(old) & set(new):
            for k, v in _module(state, f"{src}{old.index(e)}.").items():
                state[f"{dst}{new.index(e)}.{k}"] = v.clone()
        done["convs_carried"] = sorted(set(old) & set(new))
    if change.mapped is not None and change.to_end < L:
        inside = [e for e in new if e <= change.mapped[1]]
        if not inside:
            done["mapped"] = "the block holds no stage the output module has a conv for: not mapped"
        elif x is None or not len(x):
            done["mapped"] = "no data on the server: not mapped"
        else:
            done["mapped"], done["map_mse"] = list(change.mapped), _map(state, model, change.mapped[0], change.to_end,
                                                                    inside, x, seed)
    return state, done


def _map(state: dict, model: LayeredModel, start: int, to_end: int, inside: list[int], x: np.ndarray,
         seed: int) -> float:
    """Distil layers [start, inside[-1]) into the head's convs of the stages ending at `inside`; the distilled
    tensors go into `state`. Returns the last pass's mean squared error."""
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("aux.")}, strict=True)
    prefix = aux_key(to_end, "conv")
    head = model.aux_head(to_end, "conv")
    head.load_state_dict(_module(state, prefix), strict=True)
    student = nn.Sequential(*list(cast(nn.Sequential, head))[: len(inside)])
    model.eval()
    with torch.no_grad():
        inputs = model(torch.as_tensor(x), 0, start)
        target = model(inputs, start, inside[-1])
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(student.parameters(), lr=MAP_LR)
    student.train()
    losses = []
    for step in range(MAP_STEPS):
        if step * MAP_BATCH % len(inputs) < MAP_BATCH:      # a new pass: a new order
            order = torch.randperm(len(inputs), generator=gen)
        i = step * MAP_BATCH % len(inputs)
        idx = order[i:i + MAP_BATCH]
        loss = F.mse_loss(student(inputs[idx]), target[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    # its batch-norm statistics of the whole sample (the running average of a few passes lags the weights)
    with torch.no_grad():
        for bn in (m for m in student.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)):
            bn.reset_running_stats()
            bn.momentum = None
        for i in range(0, len(inputs), MAP_BATCH):
            student(inputs[i:i + MAP_BATCH])
    for k, v in student.state_dict().items():
        state[prefix + k] = v.detach().clone()
    return float(np.mean(losses[-max(1, len(inputs) // MAP_BATCH):]))
