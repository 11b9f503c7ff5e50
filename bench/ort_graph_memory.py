"""What ONNX Runtime's training graph itself holds at once, beside what the cost model and the device measured.

For each set (exported as `edgefl export` writes it), the training graph runs once in an InferenceSession with
every node's output made a graph output, which sizes every tensor exactly (ONNX shape inference leaves many of
a training graph's tensors unsized). Walking the nodes in the graph's order, a tensor lives from the node that
makes it to its last reader: the most bytes alive at once is the graph's live peak, what an executor running the
nodes in this order must hold for its activations and gradients, before any kernel scratch. The rows set it
beside the cost model's step peak and kept bytes (torch autograd's accounting, what `workspace_factor` scales),
and beside the peak a device measured for the same set in bench/results/artifact_memory.json.

The questions it answers: does ORT's graph keep more than torch autograd does, per family, as the fitted
workspace factors suggested (1.06 densenet40 ... 1.61 vit, with ORT's buffer reuse on)? And (`fits`) would ORT's
constants, fitted as artifact_memory fits them but on the graph's live peak in place of the cost model's step
peak, bound a held-out family more tightly? The graph's live peak is 0.96-1.12 of the step peak: the factors'
spread was not in the graph but in ORT's allocation plan, which held the buffers it meant to reuse
(bench/ort_mem_reuse.py); with reuse off the factors are 0.92-1.12.

Run: python bench/ort_graph_memory.py [--models vit,densenet40] [--configs 0:1,0:0.25] [-o FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import artifact_memory as am  # noqa: E402

from edgefl.cost.constants import DEFAULTS, family  # noqa: E402
from edgefl.cost.profile_store import ProfileStore  # noqa: E402
from edgefl.zoo import ModelRef, build  # noqa: E402

MODELS = "resnet20,cnn,transformer,vgg11bn,densenet40,vit"
TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_, "tensor(int32)": np.int32}


def tensor_sizes(model, folder: Path, batch: int, rows: int) -> dict[str, int]:
    """Bytes of every node output of the training graph `model` (an onnx ModelProto) at `batch`."""
    import onnx
    import onnxruntime

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    listed = {o.name for o in probe.graph.output}
    for name in dict.fromkeys(o for n in probe.graph.node for o in n.output if o and o not in listed):
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    path = folder / "every_output.onnx"
    onnx.save(probe, str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = {}
    for i in session.get_inputs():
        # the symbolic dims: the batch, and the label rows (a sequence model has batch x context of them)
        shape = [rows if d == "rows" else batch if isinstance(d, str) or d is None else d for d in i.shape]
        kind = TYPES[i.type]
        feeds[i.name] = rng.random(shape).astype(kind) if kind == np.float32 else np.zeros(shape, kind)
    names = [o.name for o in session.get_outputs()]
    return {n: v.nbytes for n, v in zip(names, session.run(names, feeds))}


def live_peak(model, size: dict[str, int]) -> tuple[int, dict[str, int], str]:
    """(most bytes of node outputs alive at once in node order, those bytes by the op type that made them, the
    node at the peak). Graph inputs (weights, the batch, gradient buffers) are not counted: the cost model's
    floor holds them."""
    inputs = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    last = {}
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            last[name] = index
    maker, alive, peak, at, live = {}, 0, 0, "", set()
    by_op = {}
    for index, node in enumerate(model.graph.node):
        for name in node.output:
            if name and name not in inputs:
                maker[name] = node.op_type
                alive += size.get(name, 0)
                live.add(name)
        if alive > peak:
            peak, at = alive, f"{node.op_type} {node.name}"
            by_op = Counter()
            for name in live:
                by_op[maker[name]] += size.get(name, 0)
        for name in set(node.input):
            if name in live and last[name] == index and name not in outputs:
                alive -= size.get(name, 0)
                live.discard(name)
    return peak, dict(sorted(by_op.items(), key=lambda kv: -kv[1])), at


def key(r: dict) -> tuple:
    return r["model"], r["frozen_prefix"], r["head_width"]


def measured_rows(path: Path) -> tuple[dict[tuple, dict], int | None]:
    """ORT's rows of artifact_memory's results by (model, frozen prefix, head width), and its measured baseline."""
    if not path.exists():
        return {}, None
    d = json.loads(path.read_text())
    return {key(r): r for r in d.get("rows", []) if r["backend"] == "ort"}, d.get("ort_baseline_bytes")


def fits_side_by_side(device_rows: list[dict], live: dict[tuple, int], baseline: int, store: ProfileStore) -> dict:
    """ORT's constants fitted the way artifact_memory fits them, on the device rows, once with the cost model's
    step peak and once with the graph's live peak in its place: measured/predicted in sample (each family its own
    constants) and out of sample (leave one family out)."""
    out = {}
    for label, step_of in (("cost_model_step", None), ("graph_live_step", lambda r: live[key(r)])):
        fitted = am.fit_families(device_rows, store, baseline, "ort", step_of=step_of)
        got = [r["peak_rss_bytes"] / q for r, q in
               zip(device_rows, am.predict_rows(device_rows, store, "ort", fitted, step_of))]
        held_out = am.leave_one_family_out(device_rows, store, baseline, "ort", step_of)
        out[label] = {"in_sample_min": min(got), "in_sample_max": max(got),
                      "family_factors": {f.family: f.workspace_factor for f in fitted.families},
                      "leave_one_family_out": {
                          name.removeprefix("held_out_"): [v["measured_over_predicted_min"],
                                                           v["measured_over_predicted_max"]]
                          for name, v in held_out.items()},
                      "families": sorted({family(r["model"]) for r in device_rows})}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--configs", help="frozen prefix:head width pairs for every model (default: artifact_memory's "
                                      "grid, the sets its rows measured)")
    ap.add_argument("--measured", default="bench/results/artifact_memory.json",
                    help="the device peaks to set beside (rows of the same sets)")
    ap.add_argument("-o", "--output", default="bench/results/ort_graph_memory.json")
    args = ap.parse_args()

    import onnx

    from edgefl.export.backends import get_backend
    from edgefl.export.pipeline import export_set

    store = ProfileStore(persist=False)
    measured, baseline = measured_rows(Path(args.measured))
    factors = {f.family: f.workspace_factor for f in DEFAULTS["ort"].families}
    rows, live = [], {}
    for name in args.models.split(","):
        ref = ModelRef.of(name)
        state = build(ref).state_dict()
        profile = store.full(ref)
        for config in am.configs(profile.num_layers, args.configs or am.GRID.get(name)):
            terms = am.row_cost(store, ref, config, "ort", DEFAULTS["ort"]).terms
            rows_per_batch = config.batch_size * (profile.layers[-1].output_bytes // (4 * profile.num_classes) or 1)
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                export_set(ref, config, state, get_backend("ort"), folder / "set")
                graph = onnx.load(str(folder / "set" / "training_model.onnx"))
                peak, by_op, at = live_peak(graph, tensor_sizes(graph, folder, config.batch_size, rows_per_batch))
            where = (name, config.frozen_prefix, config.head_width)
            device = measured.get(where)
            live[where] = peak
            row = {"model": name, "frozen_prefix": config.frozen_prefix, "head_width": config.head_width,
                   "batch_size": config.batch_size, "graph_live_peak_bytes": peak, "graph_live_at": at,
                   "graph_live_by_op_bytes": by_op, "cost_model_step_peak_bytes": terms.step_peak_bytes,
                   "cost_model_kept_bytes": terms.kept_bytes,
                   "graph_live_over_step_peak": peak / terms.step_peak_bytes,
                   "fitted_workspace_factor": factors.get(family(name)),
                   "device_peak_rss_bytes": device["peak_rss_bytes"] if device else None}
            rows.append(row)
            print(f"{name:12} k={config.frozen_prefix:<3} s={config.head_width:<5g} graph live "
                  f"{peak / 2**20:7.1f} MiB  cost-model step {terms.step_peak_bytes / 2**20:7.1f} MiB  ratio "
                  f"{row['graph_live_over_step_peak']:.3f}  fitted factor {row['fitted_workspace_factor']}", flush=True)
    out = {"date": datetime.date.today().isoformat(), "doc": __doc__.split("\n\n")[1].replace("\n", " "),
           "rows": rows}
    device_rows = [r for k, r in measured.items() if k in live]
    if baseline and len({r["model"] for r in device_rows}) > 1:
        out["fits"] = fits_side_by_side(device_rows, live, baseline, store)
        for label, f in out["fits"].items():
            print(f"{label}: in sample {f['in_sample_min']:.3f}-{f['in_sample_max']:.3f}; held out "
                  + ", ".join(f"{n} {lo:.3f}-{hi:.3f}" for n, (lo, hi) in f["leave_one_family_out"].items()))
    Path(args.output).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
