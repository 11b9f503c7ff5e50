"""The ONNX Runtime trainer: numpy and onnxruntime-training only, torch never imported (ort_shim).

Per step: the prefix's inference session, then the suffix's training module (forward, backward, gradients
into the checkpoint state), then

* BN statistics: ORT never writes them into the state; the training graph outputs their updated values
  ('<stat>.updated', edgefl.export.ort_backend). ORT updates the running variance with the biased batch
  variance where torch uses the unbiased one: with m the ONNX momentum, n = batch * per_sample values per
  channel, the variance torch keeps is m*v + (v_ort - m*v) * n / (n - 1), v the value before the step;
* the optimizer: AdamW is ORT's optimizer graph; SGD is torch.optim.SGD's rule applied here to the
  gradients (g += wd * w; b = g on the first step, else momentum * b + g; w -= lr * b);
* BN batch counters (checkpoint properties) + 1.

Memory: the prefix runs in chunks of the manifest's `prefix_batch` samples (it is inference: rows are
independent, so only one chunk's activations are ever alive; the cost model prices it so), and the eval
session opens on the first evaluation, an inference session over the eval model fed the checkpoint
state's current tensors, so a process that only trains never holds it.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from edgefl.device_runtime.ort_shim import training_api
from edgefl.device_runtime.trainers.base import ArtifactTrainer, in_chunks
from edgefl.errors import ArtifactError
from edgefl.manifest import ArtifactSet, TensorEntry

SGD_SLICE = 1 << 16     # values the SGD step updates at a time (its scratch buffer: 256 KiB)


def session_options(threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    # no arena: ORT's CPU arena grows by doubling and keeps what it grew (a CNN set peaked at 147 MiB with it,
    # 102 without); each tensor is then the allocator's own block, freed when ORT frees it
    options.enable_cpu_mem_arena = False
    # no buffer reuse: ORT's planner hands a dead tensor's buffer to a later tensor of the same size and holds
    # it through the gap; in a training graph a forward temporary (a matmul's output before its bias add) lends
    # its buffer to a gradient, so the turn from forward to backward holds every lent buffer though none is in
    # use. Off, a tensor is freed after its last reader, as the cost model's step timeline assumes. Whole models,
    # peaks above the loaded process: transformer 619 -> 475 MiB, ViT 273 -> 198, VGG-11 117 -> 102, ResNet-20
    # 68 -> 61, DenseNet-40 604 -> 596; steps about 3% longer (bench/results/ort_mem_reuse.json). Inference
    # holds no more without it (the transformer's evaluation of 32 examples: 79 -> 58 MiB)
    options.enable_mem_reuse = False
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


def inference_session(path, threads: int):
    """An inference session over the graph at `path`, or an ArtifactError naming it: onnxruntime raises its own
    exception types (InvalidProtobuf, Fail: plain Exceptions) for a file it cannot read."""
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's error types share no base class of their own
        raise ArtifactError(f"{path}: ONNX Runtime cannot load the graph ({str(exc).splitlines()[0]}); copy the set "
                            "again or re-export it") from None


class OrtTrainer(ArtifactTrainer):
    runtime = "ort"

    def __init__(self, artifacts: ArtifactSet, threads: int = 1):
        super().__init__(artifacts, threads)
        api = training_api()   # first: it must run before anything imports onnxruntime

        m, folder = self.manifest, artifacts.folder
        self.prefix = None
        if artifacts.prefix is not None:
            self.prefix = inference_session(artifacts.prefix_folder / artifacts.prefix.file("model"), threads)
        try:
            self.state = api.CheckpointState.load_checkpoint(str(folder / m.file("checkpoint")))
            self.module = api.Module(str(folder / m.file("training_model")), self.state,
                                     session_options=session_options(threads))
        except RuntimeError as exc:  # onnxruntime's own errors: a file the runtime cannot load
            raise ArtifactError(f"{folder}: ONNX Runtime cannot load the suffix ({str(exc).splitlines()[0]}); "
                                "re-export it for onnxruntime-training 1.19") from None
        self.optimizer: Optional[object] = None
        if m.optimizer.name == "adamw":
            self.optimizer = api.Optimizer(str(folder / m.file("optimizer_model")), self.module)
        self.params = [e.local for e in m.trainable if e.kind == "parameter"]
        self.counters = {e.local: int(self.state.properties[e.local]) for e in m.trainable if e.kind == "counter"}
        self.batch_norm = list(m.extra.get("batch_norm", []))
        self.momentum: dict[str, np.ndarray] = {}
        self._scratch = np.empty(SGD_SLICE, np.float32)
        self._outputs: Optional[list[str]] = None
        self._eval = None
        self._eval_state: tuple[int, dict] = (-1, {})

    def prefix_features(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        if self.prefix is None:
            return (x,)
        name = self.prefix.get_inputs()[0].name
        return in_chunks(lambda part: self.prefix.run(None, {name: part}), x, self.manifest.prefix_batch or len(x))

    def train_step(self, x: np.ndarray, y: np.ndarray, lr: float) -> float:
        features = self.prefix_features(x)
        # copies: `.data` is a view of the state's buffer, which the step rewrites
        before = {bn["var"]: self.state.parameters[bn["var"]].data.copy() for bn in self.batch_norm}
        self.module.train()
        outs = self.module(*features, np.asarray(y, np.int64))
        if self._outputs is None:
            self._outputs = list(self.module.output_names())
        self._update_statistics(outs, before, len(x))
        if self.optimizer is not None:
            self.optimizer.set_learning_rate(lr)
            self.optimizer.step()
        else:
            self._sgd(lr)
        self.module.lazy_reset_grad()
        for name in self.counters:
            self.counters[name] += 1
        self.steps += 1
        return float(outs[0])

    def _update_statistics(self, outs, before: dict[str, np.ndarray], batch: int) -> None:
        index = {name: i for i, name in enumerate(self._outputs)}
        for bn in self.batch_norm:
            m, n = bn["onnx_momentum"], batch * bn["per_sample"]
            self.state.parameters[bn["mean"]] = outs[index[bn["mean_out"]]]
            old, new = before[bn["var"]], outs[index[bn["var_out"]]]
            unbiased = m * old + (new - m * old) * (n / (n - 1) if n > 1 else 1.0)
            self.state.parameters[bn["var"]] = unbiased.astype(np.float32)

    def _sgd(self, lr: float) -> None:
        """torch.optim.SGD in place on the state's own buffers (`.data` and `.grad` are views of them), a
        slice at a time through one small scratch buffer: the step allocates nothing of the model's size,
        only the momentum buffers it keeps. Same float32 operations in the same order as the stock
        client's `w - lr * (momentum * b + (g + wd * w))` (docs/artifact-format.md), so the same bits."""
        spec = self.manifest.optimizer
        for name in self.params:
            p = self.state.parameters[name]
            w, g = p.data.reshape(-1), p.grad.reshape(-1)
            first = spec.momentum and name not in self.momentum
            if first:
                self.momentum[name] = np.empty_like(g)
            for start in range(0, len(w), SGD_SLICE):
                ws, gs = w[start:start + SGD_SLICE], g[start:start + SGD_SLICE]
                d = self._scratch[: len(ws)]
                if spec.weight_decay:
                    np.multiply(ws, spec.weight_decay, out=d)
                    np.add(gs, d, out=d)
                else:
                    np.copyto(d, gs)
                if spec.momentum:
                    b = self.momentum[name][start:start + SGD_SLICE]
                    if first:
                        np.copyto(b, d)
                    else:
                        np.multiply(b, spec.momentum, out=b)
                        np.add(b, d, out=b)
                    d = b
                step = self._scratch[: len(ws)]
                np.multiply(d, lr, out=step)
                np.subtract(ws, step, out=ws)

    def eval_batch(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        if self._eval is None:
            self._eval = inference_session(self.artifacts.folder / self.manifest.file("eval_model"), self.threads)
        if self._eval_state[0] != self.steps:   # the state's tensors as of this step, read once per evaluation
            names = [i.name for i in self._eval.get_inputs()[len(self.manifest.inputs):]]
            self._eval_state = (self.steps, {n: self.state.parameters[n].data for n in names})
        feeds = dict(zip((i.name for i in self.manifest.inputs), (*self.prefix_features(x), np.asarray(y, np.int64)),
                         strict=True))
        loss, logits = self._eval.run(["loss", "logits"], {**feeds, **self._eval_state[1]})
        return float(loss), logits

    def trained_tensor(self, entry: TensorEntry) -> np.ndarray:
        if entry.kind == "counter":
            return np.asarray(self.counters[entry.local], dtype=entry.dtype)
        return self.state.parameters[entry.local].data.reshape(entry.shape)    # a view of the state's buffer
