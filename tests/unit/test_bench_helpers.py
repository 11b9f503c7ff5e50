"""The emulation-vs-Flower benchmark's helpers: process-tree measurement, and that its lean loop (and so
the Flower clients, which run the same training code) trains what edgefl's emulation trains."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "flower_app"))

from proctree import TreeSampler, stop_tree, tree, wait_for  # noqa: E402

GRANDCHILD = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
              "'b = bytearray(160 * 2**20); import time\\nwhile time.process_time() < 0.8: pass\\n"
              "time.sleep(60)'])")


def test_sampler_counts_grandchildren_memory_and_cpu():
    child = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    try:
        with TreeSampler([child.pid], interval=0.05) as sampler:
            assert wait_for(lambda: sampler.peak_bytes > 160 * 2**20 and sampler.peak_processes >= 2, 30)
            # the grandchild spins until it has used 0.8 s of CPU, however busy the machine is
            assert wait_for(lambda: sampler.timeline[-1][1] - sampler.timeline[0][1] > 0.5, 60)
        assert sampler.peak_processes >= 2
        assert sampler.peak_bytes > 160 * 2**20
        first, last = sampler.timeline[0], sampler.timeline[-1]
        assert last[1] - first[1] > 0.5              # busy grandchild's CPU is seen
        assert first[1] <= sampler.cpu_at((first[0] + last[0]) / 2) <= last[1]
    finally:
        stop_tree(child.pid, timeout=5)
    assert not [p for p in tree([child.pid]) if p.status() != "zombie"]


def test_headline_ratios_and_goals():
    from emulate_vs_flower import headline
    rows = {"compute_bound": {"systems": {
        "edgefl": {"end_to_end_s": 50.0, "round_loop_s": 44.0, "peak_rss_bytes": 1, "final_accuracy": 0.85,
                   "cpu_s": 40.0, "round_loop_cpu_s": 30.0},
        "flower": {"end_to_end_s": 100.0, "peak_rss_bytes": 4, "final_accuracy": 0.851, "cpu_s": 60.0},
        "lean": {"round_loop_s": 40.0, "round_loop_cpu_s": 25.0}}},
        "overhead_bound": {"systems": {
            "edgefl": {"steady_rounds_per_s": 1.0, "steady_cpu_s_per_round": 2.0, "final_accuracy": 0.5},
            "flower": {"steady_rounds_per_s": 0.5, "steady_cpu_s_per_round": 5.0, "final_accuracy": 0.52}}}}
    out = headline(rows)
    assert out["speedup"] == 2.0 and out["rss_ratio"] == 0.25 and out["vs_lean"] == pytest.approx(1.1)
    assert out["speedup_overhead_bound"] == 2.0 and out["speedup_overhead_bound_cpu"] == 2.5
    assert out["speedup_cpu"] == 1.5 and out["vs_lean_cpu"] == 1.2
    assert out["accuracy_gap_points"] == {"compute_bound": 0.1, "overhead_bound": 2.0}
    assert out["goals"] == {"vs_lean <= 1.15": True, "speedup >= 1.3": True, "rss_ratio <= 0.4": True,
                            "speedup_overhead_bound >= 3": False,
                            "accuracy within 1 point of Flower (compute_bound)": True,
                            "accuracy within 1 point of Flower (overhead_bound)": False}


@pytest.mark.usefixtures("one_thread")
def test_lean_loop_trains_what_edgefl_emulation_trains():
    """Same partition, initial weights, sampled clients, learning rates and seeds: the lean FedAvg loop
    (whose training code the Flower clients share) ends at edgefl's global weights."""
    from emulate_vs_flower import make_schedule
    from fedbench import task
    from lean_fedavg import fedavg

    from edgefl.data import Dataset, parse_partition
    from edgefl.engines.local import emulate
    from edgefl.fleet import parse_fleet
    from edgefl.planning.plan import verify
    from edgefl.planning.strategies import PlanContext, get_strategy
    from edgefl.server.coordinator import LoopSettings
    from edgefl.zoo import ModelRef, build

    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (120, 1, 28, 28), dtype=np.uint8)
    train = Dataset(x=task.images(raw), y=rng.integers(0, 10, 120).astype(np.int64), classes=10, name="synthetic")
    fleet = parse_fleet("fleet:\n  groups:\n    c: {count: 4, memory_budget: 8GiB, runtime: torch}\n")
    settings = LoopSettings(rounds=2, clients_per_round=2, seed=3, eval_every=2, lr=0.05, lr_final=0.005)
    shares = parse_partition("iid").split(train.y, 4, 3)
    ref = ModelRef.of("cnn", num_classes=10, input_shape=(1, 28, 28))
    strategy = get_strategy("fedavg")
    plan = verify(strategy.plan(PlanContext(fleet, ref, rounds=2, batch_size=16)), fleet)
    records, server = emulate(fleet, plan, strategy, ref, train, None, shares, settings)

    schedule = make_schedule(fleet, settings)
    assert [sorted(r.sampled) for r in records] == [r["devices"] for r in schedule["rounds"]]
    torch.manual_seed(settings.seed)
    initial = list(build(ref).state_dict().values())
    model = task.cnn()
    model.load_state_dict(dict(zip(model.state_dict(), initial, strict=True)))
    fedavg(model, {"x": train.x, "y": train.y, "partitions": shares}, schedule, batch_size=16, epochs=1)
    for (name, ours), theirs in zip(model.state_dict().items(), server.state.values(), strict=True):
        assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5), name
    assert not torch.allclose(model.state_dict()["0.weight"], initial[0])    # it did train


def test_reproduce_slt_merges_split_runs_and_orders_them(tmp_path):
    import json

    import reproduce_slt

    base = {"rounds": 30, "devices": 100, "clients_per_round": 10, "model": "resnet20", "train_examples": 60000,
            "test_examples": 10000, "runtime": "ort", "budgets_bytes": {"s=0.125": 1}}
    first = {**base, "settings": {"iid/s=0.125": {"slt": {"final": 0.8}, "small": {"final": 0.1},
                                                   "fedrolex": {"final": 0.3}, "fd": {"final": 0.2}}}}
    second = {**base, "settings": {"iid/s=0.125": {"small": {"final": 0.5}}}}   # a rerun replaces the first
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for path, part in zip(paths, (first, second)):
        path.write_text(json.dumps(part))

    result = reproduce_slt.merge(paths)
    reproduce_slt.summarise(result)

    assert result["settings"]["iid/s=0.125"]["small"]["final"] == 0.5
    assert result["orderings"]["iid/s=0.125"] == ["slt", "small", "fedrolex", "fd"]
    assert result["merged_from"] == ["a.json", "b.json"]
    # a merge merged again (a study finished part by part) still names every run it was built from
    (tmp_path / "ab.json").write_text(json.dumps(result))
    (tmp_path / "c.json").write_text(json.dumps({**base, "settings": {"iid/s=0.125": {"fd": {"final": 0.25}}}}))
    again = reproduce_slt.merge([tmp_path / "ab.json", tmp_path / "c.json"])
    assert again["merged_from"] == ["a.json", "b.json", "c.json"]
    assert again["settings"]["iid/s=0.125"]["fd"]["final"] == 0.25
    assert result["matches_paper_order"] == {"iid/s=0.125": True} and result["ties"] == {"iid/s=0.125": []}
    second["settings"]["iid/s=0.125"]["fd"] = {"final": 0.295}        # within a point of FedRolex: a tie
    paths[1].write_text(json.dumps(second))
    result = reproduce_slt.merge(paths)
    reproduce_slt.summarise(result)
    assert result["ties"] == {"iid/s=0.125": [["fedrolex", "fd"]]}
    assert result["matches_paper_order"] == {"iid/s=0.125": "up to ties"}
    paths[1].write_text(json.dumps({**second, "rounds": 20}))
    with pytest.raises(SystemExit, match="rounds"):
        reproduce_slt.merge(paths)


def test_scaling_keeps_each_engines_median_run_and_pairs_ray_with_the_local_run_beside_it():
    from emulate_scaling import median_run, overheads
    local = [{"steady_s_per_round": s, "steady_cpu_s_per_round": s} for s in (2.0, 3.0, 2.5)]
    ray = [{"steady_s_per_round": s, "steady_cpu_s_per_round": c} for s, c in ((2.2, 3.0), (3.0, 3.3), (2.5, 5.0))]
    assert median_run(local)["steady_s_per_round"] == 2.5
    assert median_run(local)["steady_s_per_round_runs"] == [2.0, 3.0, 2.5]
    assert median_run(local[:2])["steady_s_per_round"] == 2.0       # even count: the lower middle run
    out = overheads(local, ray)
    # per repeat: wall +10%, 0, 0; CPU +50%, +10%, +100% (each ray run against the local run of its repeat)
    assert out["ray_overhead_wall"] == pytest.approx(0.0) and out["ray_overhead_wall_range"] == pytest.approx([0, 0.1])
    assert out["ray_overhead_cpu"] == pytest.approx(0.5) and out["ray_overhead_cpu_range"] == pytest.approx([0.1, 1.0])


def test_a_step_in_depth_is_resolved_only_beyond_two_block_standard_errors():
    from pretrained_set import BLOCK, paired_difference

    rng = np.random.default_rng(0)
    shallower = rng.uniform(1.0, 2.0, 50 * BLOCK)                       # passages of very different difficulty
    clear = paired_difference(shallower - 0.01 + rng.normal(0, 0.01, len(shallower)), shallower)
    assert clear["loss_gain"] == pytest.approx(0.01, abs=0.002) and clear["resolved"]
    assert clear["windows_deeper_better"] > 0.75
    # the same mean gain hidden in block-to-block noise: each block of passages favours one model or the other
    swing = np.repeat(rng.permutation([-0.1, 0.1] * 25), BLOCK)
    noisy = paired_difference(shallower - 0.01 + swing, shallower)
    assert noisy["loss_gain"] == pytest.approx(0.01)
    assert noisy["standard_error"] > 0.01 and not noisy["resolved"]
    # the error is over blocks, not windows: an error over single windows would have called it resolved
    assert 2 * np.std(swing, ddof=1) / np.sqrt(len(swing)) < noisy["loss_gain"]
    with pytest.raises(SystemExit, match="needs at least 40"):
        paired_difference(shallower[: 2 * BLOCK - 1], shallower[: 2 * BLOCK - 1])


def test_a_set_lacking_depths_lines_up_with_the_full_sets_in_the_pretrained_tables(tmp_path, monkeypatch):
    import json

    import reproductions_doc

    def step(gain):
        return {"loss_gain": gain, "standard_error": 0.001, "windows_deeper_better": 0.6, "resolved": True}

    def pretrained_set(losses: dict, steps: dict) -> dict:
        return {"settings": {"steps": 100, "dropout": 0.05, "context": 80}, "corpus_tokens": 1000, "works": ["a"],
                "depths": {d: {"held_out_loss": v, "validation_loss": v, "best_step": 100} for d, v in losses.items()},
                "held_out_loss_strictly_decreasing_with_depth": True,
                "every_test_window": {**{d: {"windows": 50, "held_out_loss": v} for d, v in losses.items()},
                                      "steps_in_depth": steps}}
    full = pretrained_set({"3": 1.5, "6": 1.4, "9": 1.3, "12": 1.2},
                          {"3->6": step(0.1), "6->9": step(0.1), "9->12": step(0.1)})
    deep_only = pretrained_set({"9": 1.25, "12": 1.21}, {"9->12": step(0.04)})
    for name, r in (("full", full), ("deep_only", deep_only)):
        (tmp_path / f"reproduce_{name}.json").write_text(json.dumps(r))
    monkeypatch.setattr(reproductions_doc, "RESULTS", tmp_path)
    monkeypatch.setattr(reproductions_doc, "PRETRAINED_SETS", ("full", "deep_only"))

    rows = [line.split(" | ") for line in reproductions_doc.render_pretrained_sets().splitlines() if line.startswith("| `")]
    sets, windows = [r for r in rows if len(r) == 8], [r for r in rows if len(r) == 5]
    partial = next(r for r in sets if "deep_only" in r[0])
    assert partial[4] == "- / - / 1.250 / 1.210" and partial[7] == "9 -> 12 only: yes |"
    assert next(r for r in sets if "`full" in r[0])[7] == "yes |"
    partial_windows = next(r for r in windows if "deep_only" in r[0])
    assert partial_windows[1] == "- / - / 1.250 / 1.210"
    # its one step sits under the 9 -> 12 column, not the first one
    assert partial_windows[2:] == ["-", "-", "+0.0400 +- 0.0010, 60% of windows, resolved |"]


def test_runs_on_other_pretrained_sets_show_start_and_final_and_what_was_not_run(tmp_path, monkeypatch):
    import json

    import reproductions_doc

    order = ["caff", "lora"]

    def run(columns: dict) -> dict:
        return {"settings": {"seed": 0}, "paper_order": order,
                "budgets_bytes": {c: b for c, (b, _) in columns.items()},
                "methods": {c: {m: {"start": s, "final": f} for m, (s, f) in rows.items()}
                            for c, (_, rows) in columns.items()},
                "our_order": {c: order for c in columns}, "matches_paper_order": {c: True for c in columns}}
    both = run({"tight": (100 * 2**20, {"caff": (0.5, 0.52), "lora": (0.4, 0.41)}),
                "wide": (200 * 2**20, {"caff": (0.5, 0.55), "lora": (0.45, 0.46)})})
    tight_only = run({"tight": (100 * 2**20, {"caff": (0.6, 0.61), "lora": (0.42, 0.43)})})
    for name, r in (("a", both), ("b", tight_only)):
        (tmp_path / f"reproduce_{name}.json").write_text(json.dumps(r))
    monkeypatch.setattr(reproductions_doc, "RESULTS", tmp_path)

    assert "No run on another" in reproductions_doc.render_caff_sets((("a", "set A"), ("missing", "set M")))
    lines = reproductions_doc.render_caff_sets((("a", "set A"), ("b", "set B"))).splitlines()
    assert lines[0] == "| budget | method | set A, start -> final | set B, start -> final |"
    assert "| 100.0 MiB | caff | 50.00 -> 52.00 | 60.00 -> 61.00 |" in lines
    assert "| 200.0 MiB | lora | 45.00 -> 46.00 | not run |" in lines
    assert "| 200.0 MiB | caff > lora (yes) | not run |" in lines


def test_a_study_to_convergence_renders_each_seed_its_mean_convergence_and_evidence(tmp_path, monkeypatch):
    import json

    import reproductions_doc
    from reproduction import combine

    def row(score, gain, **flags):
        return {"final": score, "final_last10": score, "best": score + 0.003,
                "converged": {"converged": gain < 0.01, "gain_over_last_rounds": gain}, **flags}

    def seed(k, methods, column="resnet", **settings):
        return {"settings": {"seed": k, "column": column, "model": "m", "data": "d", "train_examples": 10,
                             "test_examples": 5, "partition": "iid", "devices": 4, "clients_per_round": 2,
                             "rounds": 9, "full_model_share": 0.08, "runtime": "ort", **settings},
                "paper": {"ahead_by_points": {"depthfl": 13.7}}, "paper_order": ["profl", "depthfl"],
                "budgets_bytes": {"b0": 2**20, "b1": 3 * 2**20}, "methods": methods}
    parts = {"s0": seed(0, {"profl": row(0.85, 0.003), "depthfl": row(0.88, 0.004)}),
             "e0": seed(0, {"depthfl-half": row(0.86, 0.02, evidence=True)}),
             "s1": seed(1, {"profl": row(0.84, 0.002)}),
             "g0": seed(0, {"profl": row(0.8, 0.0)}, column="vgg11bn", device="cuda"),
             "c0": seed(0, {"profl": row(0.82, 0.0)}, column="vgg11bn"),
             # a study whose budgets are not set by a share fitting the whole model (FeDepth's, FedOLF's)
             "f0": seed(0, {"profl": row(0.81, 0.0)}, column="widths", full_model_share=None)}
    for name, part in parts.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(part))
    combined = combine([tmp_path / f"{n}.json" for n in parts], "resnet")
    (tmp_path / "reproduce_study.json").write_text(json.dumps(combined))
    monkeypatch.setattr(reproductions_doc, "RESULTS", tmp_path)

    lines = reproductions_doc.render_combined("study").splitlines()
    assert "| profl | first | 85.0 (85.3) | 84.0 (84.3) | 84.5 | yes (+0.3), yes (+0.2) |" in lines
    assert "| depthfl | profl -13.7 | 88.0 (88.3) | not run yet | n/a | yes (+0.4), n/a |" in lines
    assert "| depthfl-half (evidence) |  | 86.0 (86.3) | not run yet | n/a | **no** (+2.0), n/a |" in lines
    assert "Seed 0: depthfl > profl. Matches the paper's profl > depthfl: **no**." in lines
    assert "1.0 MiB to 3.0 MiB" in lines[0] and "trained on" not in lines[0]
    assert any(line.startswith("**vgg11bn on cuda**") and "3.0 MiB, trained on cuda)" in line for line in lines)
    # the CPU run of the same column is its own table, never merged with the GPU's
    assert any(line.startswith("**vgg11bn** (") and "trained on" not in line for line in lines)
    assert "| profl | first | 82.0 (82.3) | 82.0 | yes (+0.0) |" in lines
    assert "| profl | first | 80.0 (80.3) | 80.0 | yes (+0.0) |" in lines
    widths = next(line for line in lines if line.startswith("**widths** ("))
    assert "9 rounds, ort budgets 1.0 MiB" in widths and "fitting" not in widths


@pytest.mark.parametrize("name", ["fedepth", "fedolf"])
def test_fedepth_and_fedolf_run_to_convergence_as_their_own_column_one_file_per_seed(name):
    import importlib
    from dataclasses import replace

    from reproduction import arguments

    study = importlib.import_module(f"reproduce_{name}").STUDY
    column = study.columns["to-convergence"]
    # the 25-round setting, longer and scored by its last 10 rounds: nothing else changes
    assert {k: v for k, v in column["settings"].items() if k != "rounds"} == \
        {k: v for k, v in study.settings.items() if k != "rounds"}
    assert (study.settings["rounds"], column["settings"]["rounds"], column["score_last"]) == (25, 300, 10)
    converging = replace(study, **column)
    results = ROOT / "bench" / "results"
    # each seed its own file (a second seed's run never overwrites the first's); --combine writes the seedless one
    assert arguments(converging, "", ["--seed", "1"]).output == results / f"reproduce_{name}_convergence_seed1.json"
    assert arguments(converging, "", []).output == results / f"reproduce_{name}_convergence_seed0.json"
    assert arguments(converging, "", ["--combine", "a.json"]).output == results / f"reproduce_{name}_convergence.json"
    # the 25-round study keeps its file names: seed 0's has none
    assert arguments(study, "", []).output == results / f"reproduce_{name}.json"
    assert arguments(study, "", ["--seed", "1"]).output == results / f"reproduce_{name}_seed1.json"


def test_profl_last_step_finds_what_the_accuracy_follows():
    """bench/profl_last_step.py: over the last step only, the accuracy's deviation from its trend is
    correlated with what each round's draw holds (here it follows the share training the output layer alone)."""
    from profl_last_step import last_step, skew

    assert skew(np.full(10, 7)) == 0
    assert skew(np.eye(10)[3] * 50) == pytest.approx(0.9)
    labels_of = {f"{g}-{i}": np.bincount([i % 10] * 5 + list(range(10)), minlength=10) for g in "ab" for i in range(10)}
    rng = np.random.default_rng(0)
    history = []
    for r in range(1, 41):
        drawn = sorted(rng.choice(sorted(labels_of), 8, replace=False))
        share = sum(d.startswith("a") for d in drawn) / len(drawn)
        history.append({"round": r, "sampled": {d: d[0] for d in drawn},
                        "decisions": {"step_label": "grow block 1/2" if r <= 10 else "grow block 2/2"},
                        "accuracy": None if r % 2 and r < 31 else 0.7 + 0.002 * r - 0.05 * share})
    step = last_step(history, {"a"}, labels_of)
    assert (step["step"], step["first_round"], step["evaluations"]) == ("grow block 2/2", 11, 20)
    assert step["correlation_with_residual"]["output_layer_share"] < -0.9
    assert [r for r, _ in step["last_10"]] == list(range(31, 41))
    assert step["last_10_draws"] == [sorted(h["sampled"]) for h in history[-10:]]
