"""The ExecuTorch trainer for artifacts of edgefl.export.executorch_backend. Imports ExecuTorch (and with
it torch, which its Python bindings need) only when this runtime is chosen.

The suffix program's one method runs forward and backward (edgefl.export.executorch_program has its
signature). Its parameters live in memory the runtime owns (loaded from `weights.ptd`), reached through
`Method.get_attribute` as tensors that alias it. The optimizer is torch.optim (the manifest's SGD or
AdamW: torch's semantics exactly) stepping those aliases with the gradients the method returns:
ExecuTorch's Python bindings expose only SGD, at a learning rate fixed when it is created, and the
learning rate comes with every step. BN running statistics and batch counters are the trainer's, inputs
and outputs of the method, initialised from `state.npz`. Gradients come in the program's own order
(`__et_training_fqn_forward`), after the user outputs (loss, logits, statistics).

Evaluation runs the same method with BN on its running statistics and drops what it returns besides the
loss and logits. The program is planned for the artifact's batch (manifest `extra["batch"]`): training
takes exactly that many rows; evaluation and the prefix pad the last chunk (padded targets are ignored).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefl.device_runtime.trainers.base import IGNORE_INDEX, ArtifactTrainer, in_chunks, read_npz
from edgefl.errors import ArtifactError, ConfigError, MissingDependencyError
from edgefl.manifest import ArtifactSet, TensorEntry

FQN_METHOD = "__et_training_fqn_forward"
_KERNELS: list = []      # what this process's programs run on, once decided: (name, the loaded library)


def _edgefl_kernels() -> str:
    """edgefl's kernels (convolutions, max pools and their backward, matrix products, copies, reductions: the
    native trainer's, device_runtime/native/src) registered in ExecuTorch's Python bindings, which share the
    runtime library and its kernel registry with them; once per process, before a program loads. Required: the
    programs write pools as aten.max_pool2d_with_indices, whose shipped backward returns wrong gradients, and
    convolutions as aten.convolution, whose shipped kernels are direct loops. 'edgefl <level>', with the level
    its GEMM runs where that is above the build's (AVX-512)."""
    if _KERNELS:
        return _KERNELS[0][0]
    import ctypes

    from edgefl.device_runtime import native
    path = native.find_kernels()
    if path is None:
        raise MissingDependencyError("edgefl's ExecuTorch kernels are not built (the programs' batch norms need "
                                     "them, edgefl's own operators; the shipped pool backward returns wrong "
                                     "gradients; convolutions run tens of times slower without them); build them with 'edgefl-device build-native'")
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise MissingDependencyError(f"{path}: cannot be loaded ({exc}); rebuild it with 'edgefl-device "
                                     "build-native'") from None
    library.edgefl_cpu_has_level.restype = library.edgefl_register_kernels.restype = ctypes.c_bool
    library.edgefl_kernels_cpu_level.restype = library.edgefl_kernels_gemm_level.restype = ctypes.c_char_p
    library.edgefl_kernel_calls.restype = ctypes.c_uint64
    level = library.edgefl_kernels_cpu_level().decode()
    if not library.edgefl_cpu_has_level():
        raise ConfigError(f"{path} was built for {level} CPUs and this CPU lacks that level; rebuild it for this "
                          "CPU with 'EDGEFL_CPU_LEVEL=x86-64 edgefl-device build-native'")
    if not library.edgefl_register_kernels():
        raise ArtifactError(f"{path}: the ExecuTorch runtime loaded here lacks an operator edgefl's kernels "
                            f"replace; install executorch=={native.EXECUTORCH_VERSION}")
    gemm = library.edgefl_kernels_gemm_level().decode()
    kernels = f"edgefl {level}" + (f" (GEMM {gemm})" if gemm != level else "")
    _KERNELS.append((kernels, library))
    return kernels


def edgefl_kernel_calls(op: str) -> int:
    """Calls edgefl's kernel for `op` ("convolution", "bmm", ...) served in this process so far."""
    _edgefl_kernels()
    return int(_KERNELS[0][1].edgefl_kernel_calls(op.encode()))


def _load(path: Path, data: Path | None = None):
    from executorch.extension.pybindings import portable_lib as et
    try:
        return et._load_program(str(path), data_path=None if data is None else str(data))
    except RuntimeError as exc:
        raise ArtifactError(f"{path}: ExecuTorch cannot load the program ({exc}); re-export it") from None


def _method(program, name: str, path: Path):
    """A method of a loaded program: a damaged file can load as a program and fail only here."""
    try:
        return program.load_method(name)
    except RuntimeError as exc:
        raise ArtifactError(f"{path}: ExecuTorch cannot load its method {name!r} ({exc}); the file is damaged or "
                            "from another ExecuTorch version: copy the set again or re-export it") from None


def _pad(arrays, rows: int) -> list:
    """Each array grown to `rows` rows by repeating its first row (real values: no NaN in padding)."""
    return [a if len(a) == rows else np.concatenate([a, np.repeat(a[:1], rows - len(a), axis=0)]) for a in arrays]


class ExecuTorchTrainer(ArtifactTrainer):
    runtime = "executorch"
    exact_batch = True      # programs are planned for one batch size: a smaller remainder is skipped

    def __init__(self, artifacts: ArtifactSet, threads: int = 1):
        super().__init__(artifacts, threads)
        import torch
        from executorch.extension.pybindings import portable_lib as et

        torch.set_num_threads(threads)
        et._unsafe_reset_threadpool(threads)      # nothing runs yet: the one moment this is safe
        self.kernels = _edgefl_kernels()
        self._torch = torch
        m, folder = self.manifest, artifacts.folder
        self.rows = int(m.extra["batch"])
        self.prefix = None
        if artifacts.prefix is not None:
            prefix = artifacts.prefix_folder / artifacts.prefix.file("model")
            self.prefix = _method(_load(prefix), "forward", prefix)
            self.prefix_rows = int(artifacts.prefix.extra["batch"])
        program = folder / m.file("program")
        self.program = _load(program, folder / m.file("weights"))
        self.method = _method(self.program, "forward", program)
        key = m.extra["prefix"]
        self.order = [name[len(key):] for name in _method(self.program, FQN_METHOD, program).call([])]
        self.params = {name: self.method.get_attribute(key + name) for name in self.order}
        buffers = {k: torch.from_numpy(v) for k, v in read_npz(folder / m.file("statistics")).items()}
        self.stats = [buffers[k] for k in m.extra["statistics"]]
        self.counters = {e.local: buffers[e.local] for e in m.trainable if e.kind == "counter"}
        trained = [self.params[name] for name in self.order]
        spec = m.optimizer
        self.optimizer = (torch.optim.SGD(trained, lr=0.0, momentum=spec.momentum, weight_decay=spec.weight_decay)
                          if spec.name == "sgd" else
                          torch.optim.AdamW(trained, lr=0.0, betas=spec.betas, eps=spec.eps,
                                            weight_decay=spec.weight_decay))

    def prefix_features(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        if self.prefix is None:
            return (np.asarray(x),)

        def run(part):
            outs = self.prefix.call([self._torch.from_numpy(a) for a in _pad([np.ascontiguousarray(part)],
                                                                            self.prefix_rows)])
            return [o.numpy()[: len(part)] for o in outs]
        return in_chunks(run, x, self.prefix_rows)

    def _run(self, features, labels: np.ndarray, train: bool) -> list:
        torch = self._torch
        switch = torch.ones(()) if train else torch.zeros(())
        return self.method.call([*[torch.from_numpy(np.ascontiguousarray(f)) for f in features],
                                 torch.from_numpy(np.asarray(labels, np.int64).reshape(-1)), switch, *self.stats],
                                clone_outputs=False)

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        if len(x) != self.rows:
            raise ConfigError(f"{self.artifacts.folder / 'manifest.json'}: the ExecuTorch program trains batches "
                              f"of exactly {self.rows} examples, got {len(x)}; give at least {self.rows} examples "
                              "or export the artifact with that batch size")
        outs = self._run(self.prefix_features(x), y, train=True)
        loss, first = float(outs[0]), 2 + len(self.stats)
        self.stats = [t.clone() for t in outs[2:first]]
        for name, grad in zip(self.order, outs[first:first + len(self.order)], strict=True):
            self.params[name].grad = grad
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        for p in self.params.values():
            p.grad = None                 # the gradients are the program's memory, rewritten next step
        for counter in self.counters.values():
            counter += 1
        self.steps += 1
        return loss

    def eval_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        y = np.asarray(y, np.int64).reshape(-1)
        rows = len(y) // max(len(x), 1)
        losses, logits = [], []
        for start in range(0, len(x), self.rows):
            xb = x[start:start + self.rows]
            yb = y[start * rows:(start + len(xb)) * rows]
            labels = np.concatenate([yb, np.full(self.rows * rows - len(yb), IGNORE_INDEX, np.int64)])
            outs = self._run(_pad(self.prefix_features(xb), self.rows), labels, train=False)
            if counted := int((yb != IGNORE_INDEX).sum()):
                losses.append((float(outs[0]), counted))
            logits.append(outs[1].numpy()[: len(yb)].copy())
        counted = sum(n for _, n in losses)
        mean = sum(loss * n for loss, n in losses) / counted if counted else float("nan")
        return mean, np.concatenate(logits)

    def trained_tensor(self, entry: TensorEntry) -> np.ndarray:
        source = {"parameter": self.params, "counter": self.counters,
                  "statistic": dict(zip(self.manifest.extra["statistics"], self.stats, strict=True))}[entry.kind]
        return source[entry.local].detach().numpy()
