"""The reproduction benches' verdict: our order beside a paper's, with SLT's one-point tie rule."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from reproduction import compare  # noqa: E402

PAPER = ["a", "b", "c"]


def rows(**finals):
    return {k: {"final": v} for k, v in finals.items()}


@pytest.mark.parametrize("finals, ours, verdict", [
    ({"a": 0.80, "b": 0.70, "c": 0.60}, ["a", "b", "c"], True),
    ({"a": 0.80, "b": 0.795, "c": 0.60}, ["a", "b", "c"], "up to ties"),    # b within a point of a
    ({"a": 0.795, "b": 0.80, "c": 0.60}, ["b", "a", "c"], "up to ties"),    # swapped, but within a point
    ({"a": 0.70, "b": 0.80, "c": 0.60}, ["b", "a", "c"], False),            # swapped by ten points
    ({"a": 0.80, "b": 0.70, "c": 0.795}, ["a", "c", "b"], False),           # c beats b by 9.5 points
])
def test_verdict(finals, ours, verdict):
    result = compare(rows(**finals), PAPER)
    assert result["our_order"] == ours
    assert result["matches_paper_order"] == verdict
    assert result["paper_order"] == PAPER


def test_ties_are_named_and_a_missing_method_gives_no_verdict():
    result = compare(rows(a=0.80, b=0.795, c=0.60), PAPER)
    assert result["ties"] == [["a", "b"]]
    partial = compare({"a": {"final": 0.8}, "b": {"final": None}, "c": {"final": 0.6}}, PAPER)
    assert partial["our_order"] == ["a", "c"] and partial["matches_paper_order"] is None


def test_energy_estimate_is_the_profiles_active_power_over_compute_and_transfer_time():
    from reproduction import energy_estimate

    from edgefl.hardware import load_profile

    p = load_profile("android-mid")
    costs = {"training_flops": 3e12, "download_bytes": 50_000_000, "upload_bytes": 25_000_000}
    e = energy_estimate(costs, "android-mid")
    assert e["computation_j"] == pytest.approx(3e12 / p.sustained_flops * p.power_active_w)
    assert e["communication_j"] == pytest.approx(8 * 75_000_000 / p.uplink_bits_per_s * p.power_active_w)
    assert e["total_j"] == pytest.approx(e["computation_j"] + e["communication_j"]) and e["profile"] == "android-mid"
    assert energy_estimate({**costs, "training_flops": 6e12})["computation_j"] == pytest.approx(2 * e["computation_j"])


def test_merge_refuses_parts_whose_budgets_were_priced_by_other_constants(tmp_path):
    from reproduction import merge
    part = {"settings": {"rounds": 2}, "budgets_bytes": {"b0": 100}, "paper_order": ["a", "b"],
            "methods": {"a": {"final": 0.5, "best": 0.5}}}
    (tmp_path / "a.json").write_text(json.dumps(part))
    (tmp_path / "b.json").write_text(json.dumps({**part, "budgets_bytes": {"b0": 90}, "methods": {"b": {"final": 0.4}}}))
    with pytest.raises(SystemExit, match="other budgets"):
        merge([tmp_path / "a.json", tmp_path / "b.json"])
    (tmp_path / "b.json").write_text(json.dumps({**part, "methods": {"b": {"final": 0.4, "best": 0.4}}}))
    assert set(merge([tmp_path / "a.json", tmp_path / "b.json"])["methods"]) == {"a", "b"}


def test_a_non_iid_run_is_compared_with_the_papers_non_iid_table():
    import reproduce_fedolf
    study = reproduce_fedolf.STUDY
    paper, order = study.compared_with("iid")
    assert order == study.paper_order and paper["accuracy"]["slt"] == 45.80
    paper, order = study.compared_with("dirichlet:0.1")
    assert order[:3] == ["fedolf", "fedolf+toa0.75", "slt"] and paper["accuracy"]["slt"] == 25.04
    assert "Table 1" in paper["source"] and paper["setting"] == study.paper["setting"]


def test_a_last10_score_orders_the_methods_where_the_final_round_would_not():
    # a ends on a lucky round, b is better over its last ten: scored as the papers score, b leads
    result = compare({"a": {"final": 0.80, "final_last10": 0.70}, "b": {"final": 0.75, "final_last10": 0.74},
                      "c": {"final": 0.60, "final_last10": 0.60}}, PAPER)
    assert result["our_order"] == ["b", "a", "c"] and result["matches_paper_order"] is False


def test_last_rounds_mean_and_convergence():
    from reproduction import CONVERGED_SPAN, last_rounds

    rounds = 100
    flat = [(r, 0.5) for r in range(5, rounds - 9, 5)] + [(r, 0.8 + (r % 2) * 0.002) for r in range(rounds - 9, rounds + 1)]
    # the last 50 rounds gained 30 points: not converged, whatever the tail's mean
    row = last_rounds(flat, rounds, 10)
    assert row["final_last10"] == pytest.approx(0.801) and row["converged"]["converged"] is False
    assert row["converged"]["gain_over_last_rounds"] == pytest.approx(0.301)
    plateau = [(r, 0.795) for r in range(5, rounds - 9, 5)] + flat[-10:]
    assert last_rounds(plateau, rounds, 10)["converged"]["converged"] is True      # 0.6 points in 50 rounds
    assert last_rounds(flat[:-1], rounds, 10) == {}           # a last round not evaluated: no score
    assert last_rounds(flat, rounds, 0) == {}
    assert CONVERGED_SPAN == 50


def test_the_loop_evaluates_each_of_the_last_rounds():
    from edgefl.server.coordinator import LoopSettings

    settings = LoopSettings(rounds=30, clients_per_round=1, eval_every=5, eval_last=10)
    assert [r for r in range(1, 31) if settings.evaluates(r)] == [5, 10, 15, 20] + list(range(21, 31))
    plain = LoopSettings(rounds=12, clients_per_round=1, eval_every=5)
    assert [r for r in range(1, 13) if plain.evaluates(r)] == [5, 10, 12]


def test_combine_orders_each_column_by_its_seeds_means(tmp_path):
    from reproduction import combine

    def part(seed, column, scores):
        methods = {m: {"final": v, "final_last10": v, "best": v + 0.01, "converged": {"converged": True}, "curve": []}
                   for m, v in scores.items()}
        return {"settings": {"seed": seed, "rounds": 9, **({"column": column} if column else {})},
                "paper": {}, "paper_order": PAPER, "budgets_bytes": {"b0": 1}, "methods": methods}
    files = []
    for name, content in {"r0": part(0, None, {"a": 0.80, "b": 0.70, "c": 0.60}),
                          "r1": part(1, "resnet", {"a": 0.60, "b": 0.74, "c": 0.61}),
                          "v0": part(0, "vgg", {"a": 0.5, "b": 0.4, "c": 0.3})}.items():
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(content))
    result = combine(files, "resnet")
    resnet = result["columns"]["resnet"]
    assert sorted(resnet["seeds"]) == ["0", "1"] and "curve" not in resnet["seeds"]["0"]["methods"]["a"]
    assert resnet["seeds"]["1"]["our_order"] == ["b", "c", "a"]
    # means: a 0.70, b 0.72, c 0.605: b leads a by two points
    assert resnet["mean"]["methods"]["b"]["final_last10"] == pytest.approx(0.72)
    assert resnet["mean"]["our_order"] == ["b", "a", "c"] and resnet["mean"]["matches_paper_order"] is False
    assert result["columns"]["vgg"]["mean"]["matches_paper_order"] is True
    # a second file of one seed (its evidence runs) adds its rows to that seed's
    (tmp_path / "e1.json").write_text(json.dumps(part(1, "resnet", {"a-ablated": 0.9})))
    both = combine(files + [tmp_path / "e1.json"], "resnet")["columns"]["resnet"]["seeds"]["1"]
    assert sorted(both["methods"]) == ["a", "a-ablated", "b", "c"] and both["files"] == ["r1.json", "e1.json"]
    assert both["our_order"] == ["b", "c", "a"]                  # evidence rows are not the paper's methods
    (tmp_path / "e2.json").write_text(json.dumps({**part(1, "resnet", {"a": 0.5}), "budgets_bytes": {"b0": 2}}))
    with pytest.raises(SystemExit, match="other budgets"):
        combine(files + [tmp_path / "e2.json"], "resnet")
    (tmp_path / "bad.json").write_text(json.dumps({**part(2, None, {"a": 0.5}), "settings": {"seed": 2, "rounds": 8}}))
    with pytest.raises(SystemExit, match="other settings"):
        combine(files + [tmp_path / "bad.json"], "resnet")
