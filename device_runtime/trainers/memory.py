"""Memory measurement as middleware around an objective: the trainer's loop does not know about it.

`measured(objective, measure)` measures the first batch's loss computation: the bytes of the unique
storages autograd keeps for backward (`saved_tensors_hooks`, deduplicated by storage, storages of weights
and buffers of every module the objective trains excluded) — the definition of
edgefl.cost.measure.measure_activation_bytes and of the profiler the cost model is built from — and hands
them to `measure`, which may raise OutOfMemory to fail the round as a real out-of-memory kill would.
"""
from __future__ import annotations

from typing import Callable

import torch


class OutOfMemory(RuntimeError):
    """The device would not have had the memory for this round's training."""


class _Measured:
    def __init__(self, objective, measure: Callable[[int], None]):
        self._objective, self._measure, self._done = objective, measure, False

    def __getattr__(self, name):
        return getattr(self._objective, name)

    def loss(self, model, config, x, y):
        if self._done:
            return self._objective.loss(model, config, x, y)
        self._done = True
        weights = {t.untyped_storage().data_ptr() for m in self._objective.modules(model)
                   for t in (*m.parameters(), *m.buffers())}
        sizes: dict[int, int] = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights and t.device.type != "meta":
                sizes[storage.data_ptr()] = storage.nbytes()
            # the graph keeps it alive until backward, so no address is reused meanwhile; a detached alias,
            # as in edgefl.cost.measure: handing back `t` itself can close a reference cycle through its grad_fn
            return t.detach()

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = self._objective.loss(model, config, x, y)
        self._measure(sum(sizes.values()))
        return loss


def measured(objective, measure: Callable[[int], None]):
    """`objective` whose first loss computation reports the activation bytes it keeps to `measure`."""
    return _Measured(objective, measure)
