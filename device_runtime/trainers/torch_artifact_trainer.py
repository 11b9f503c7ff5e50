"""The torch trainer for `torch.export` artifacts (edgefl.export.torch_backend): the fallback for devices
with torch. Imports torch (only when this runtime is chosen).

The training program runs BN in train mode and updates running statistics and batch counters itself; the
eval program, loaded on the first evaluation (a process that only trains never holds it), shares the
training program's tensors (loaded from `weights.npz` into the training program, handed to the eval
program by reference before each evaluation). torch.optim.SGD / AdamW with the
manifest's hyperparameters.
"""
from __future__ import annotations

import numpy as np
import torch

from edgefl.device_runtime.trainers.base import ArtifactTrainer, in_chunks, read_npz
from edgefl.errors import ArtifactError
from edgefl.manifest import ArtifactSet, TensorEntry


def _load(path) -> torch.nn.Module:
    try:
        return torch.export.load(str(path)).module()
    except Exception as exc:  # torch raises many types for a file it cannot read
        raise ArtifactError(f"{path}: torch cannot load the program ({type(exc).__name__}); re-export it "
                            f"with torch {torch.__version__}") from None


class TorchArtifactTrainer(ArtifactTrainer):
    runtime = "torch"

    def __init__(self, artifacts: ArtifactSet, threads: int = 1):
        super().__init__(artifacts, threads)
        torch.set_num_threads(threads)
        m, folder = self.manifest, artifacts.folder
        self.prefix = None
        if artifacts.prefix is not None:
            self.prefix = _load(artifacts.prefix_folder / artifacts.prefix.file("model"))
        self.train_program = _load(folder / m.file("training_program"))
        self.eval_program = None
        state = {k: torch.from_numpy(v) for k, v in read_npz(folder / m.file("weights")).items()}
        self.train_program.load_state_dict(state, strict=True)
        params = dict(self.train_program.named_parameters())
        trained = [params[e.local] for e in m.trainable if e.kind == "parameter"]
        spec = m.optimizer
        self.optimizer = (torch.optim.SGD(trained, lr=0.0, momentum=spec.momentum, weight_decay=spec.weight_decay)
                          if spec.name == "sgd" else
                          torch.optim.AdamW(trained, lr=0.0, betas=spec.betas, eps=spec.eps,
                                            weight_decay=spec.weight_decay))

    @torch.no_grad()
    def prefix_features(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        if self.prefix is None:
            return (np.asarray(x),)

        def run(part):
            out = self.prefix(torch.from_numpy(np.ascontiguousarray(part)))
            return [t.numpy() for t in (out if isinstance(out, (tuple, list)) else (out,))]
        return in_chunks(run, x, self.manifest.prefix_batch or len(x))

    def _features(self, x: np.ndarray) -> list[torch.Tensor]:
        return [torch.from_numpy(f) for f in self.prefix_features(x)]

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        loss, _ = self.train_program(*self._features(x), torch.from_numpy(np.asarray(y, np.int64)))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return float(loss.detach())

    @torch.no_grad()
    def eval_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        if self.eval_program is None:
            self.eval_program = _load(self.artifacts.folder / self.manifest.file("eval_program"))
        self.eval_program.load_state_dict(self.train_program.state_dict(), strict=True, assign=True)
        loss, logits = self.eval_program(*self._features(x), torch.from_numpy(np.asarray(y, np.int64)))
        return float(loss), logits.numpy()

    def trained_tensor(self, entry: TensorEntry) -> np.ndarray:
        return self.train_program.state_dict()[entry.local].detach().numpy()
