"""Write the result tables of docs/reproductions.md from bench/results/reproduce_*.json.

Each paper's section of the document holds a block between `<!-- results:NAME -->` and `<!-- /results -->`;
this script replaces every such block with a table rendered from the result file, so the document never
states a number the results do not hold. The prose around the blocks (settings, differences, explanations)
is written by hand.

Run:  python bench/reproductions_doc.py            (after any reproduce_*.py run)
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reproductions.md"
RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(r"(<!-- results:(\w+) -->\n).*?(<!-- /results -->)", re.S)

sys.path.insert(0, str(ROOT / "bench"))
from reproduction import CONVERGED_SPAN, compare  # noqa: E402  (the studies' order and tie rule, convergence)


def pct(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}"


def mib(n) -> str:
    return f"{n / 2**20:.1f} MiB"


def verdict(v) -> str:
    return {True: "yes", False: "**no**", "up to ties": "yes, up to ties", None: "not every method ran"}[v]


def kj(row: dict, part: str) -> str:
    energy = row.get("energy_estimate")
    return f"{energy[part] / 1e3:.1f}" if energy else ""


def method_table(rows: dict, paper: dict, order: list[str]) -> list[str]:
    lines = ["| method | paper | ours, final | ours, best | groups excluded | download | upload | saved by TOA "
             "| energy est., compute (kJ) | energy est., transfer (kJ) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label in order + [m for m in rows if m not in order]:
        row = rows.get(label)
        if row is None:
            lines.append(f"| {label} | {paper.get(label, '')} | not run yet | | | | | | | |")
            continue
        costs = row.get("costs", {})
        name = f"{label} (ceiling)" if row.get("ceiling") else label
        lines.append(f"| {name} | {paper.get(label, '')} | {pct(row['final'])} | {pct(row['best'])} | "
                     f"{len(row['excluded'])} | {costs.get('download_bytes', 0) / 1e6:.0f} MB | "
                     f"{costs.get('upload_bytes', 0) / 1e6:.0f} MB | {costs.get('download_saved_bytes', 0) / 1e6:.1f} MB | "
                     f"{kj(row, 'computation_j')} | {kj(row, 'communication_j')} |")
    return lines


def energy_note(rows: dict) -> list[str]:
    names = sorted({r["energy_estimate"]["profile"] for r in rows.values() if r.get("energy_estimate")})
    if not names:
        return []
    from edgefl.hardware import load_profile
    p = load_profile(names[0])
    return ["", f"Energy is estimated, not measured: every device taken as the `{p.name}` profile "
                f"({p.sustained_flops / 1e9:g} GFLOP/s sustained, {p.uplink_bits_per_s / 1e6:g} Mbit/s, "
                f"{p.power_active_w:g} W active; hardware/profiles), over the FLOPs trained and the bytes moved."]


def render_study(name: str) -> str:
    path = RESULTS / f"reproduce_{name}.json"
    if not path.exists():
        return f"No result yet: run `python bench/reproduce_{name}.py`.\n"
    r = json.loads(path.read_text())
    s = r["settings"]
    lines = [f"Ours ({s['model']}, {s['data']}, {s['train_examples']} training / {s['test_examples']} test examples, "
             f"{s['partition']}, {s['devices']} devices, {s['clients_per_round']} per round, {s['rounds']} rounds, "
             f"{s['runtime']} budgets: {', '.join(f'{g} {mib(b)}' for g, b in r['budgets_bytes'].items())}). "
             f"Accuracies in %.", ""]
    lines += method_table(r["methods"], r["paper"]["accuracy"], r["paper_order"] + ["fedavg"])
    lines += energy_note(r["methods"])
    lines += ["", f"Paper order: {' > '.join(r['paper_order'])}. Ours: {' > '.join(r['our_order']) or 'none yet'}"
              + (f" (ties within a point: {', '.join('~'.join(t) for t in r['ties'])})" if r["ties"] else "")
              + f". Matches: {verdict(r['matches_paper_order'])}."]
    return "\n".join(lines) + "\n"


def render_caff(name: str = "caff", pretrained_table: bool = True) -> str:
    path = RESULTS / f"reproduce_{name}.json"
    r = json.loads(path.read_text())
    if "settings" not in r:
        return "No result of the Table 1 setting yet: run `python bench/reproduce_caff.py --pretrained DIR`.\n"
    lines = []
    if pretrained_table:
        lines += ["Pretrained set (next-character loss, lower is better; the checkpoint kept is the one of lowest "
                  "validation loss, the held-out loss is on text the choice never saw):", "",
                  "| depth | steps (last schedule) | steps behind the kept weights | batch | dropout | validation loss "
                  "| held-out loss | train loss |",
                  "|---|---|---|---|---|---|---|---|"]
        for depth, d in r["pretrained"]["depths"].items():
            validation = f"{d['validation_loss']:.3f}" if d.get("validation_loss") is not None else "n/a"
            kept = d.get("total_steps") or d.get("best_step") or d["steps"]   # a set of one schedule records no total
            lines.append(f"| {depth} | {d['steps']} | {kept} | {d['batch_size']} | {d.get('dropout', 0.0):g} | "
                         f"{validation} | {d['held_out_loss']:.3f} | {d['train_loss']:.3f} |")
        lines += ["", "Held-out loss strictly decreasing with depth: "
                  + ("yes" if r["pretrained"]["held_out_loss_strictly_decreasing_with_depth"] else "**no**") + ".", ""]
    s = r["settings"]
    for rank, (column, rows) in enumerate(sorted(r["methods"].items(), key=lambda kv: r["budgets_bytes"][kv[0]])):
        what = (f"fine-tuning the {column} of the deepest model" if column.startswith("last ")
                else "{} times {}, the least budget at which every method runs".format(*column.lstrip("x").split(" of ")))
        lines += [f"Budget: {what} ({mib(r['budgets_bytes'][column])}, {s['runtime']}); "
                  f"{s['devices']} devices, {s['clients_per_round']} per round, {s['rounds']} rounds, "
                  f"{s['optimizer']} lr {s['lr']:g} -> {s['lr_final']:g}.", "",
                  "| method | paper | model it trained | ours, start | ours, final | ours, best | devices admitted per depth "
                  "| upload | energy est. (kJ) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        paper = paper_column(r["paper"]["accuracy"], rank)
        for m in r["paper_order"]:
            row = rows.get(m)
            if row is None:
                lines.append(f"| {m} | {paper.get(m, '')} | not run yet | | | | | | |")
                continue
            depth = re.search(r"layers=(\d+)", row.get("model") or "")
            lines.append(f"| {m} | {paper.get(m, '')} | {depth.group(1) + ' layers' if depth else 'none fits'} | "
                         f"{pct(row.get('start'), 2)} | {pct(row['final'], 2)} | {pct(row['best'], 2)} | {row.get('devices_admitted_per_depth') or ''} | "
                         f"{row.get('costs', {}).get('upload_bytes', 0) / 1e6:.0f} MB | {kj(row, 'total_j')} |")
        lines += ["", f"Ours: {' > '.join(r['our_order'][column])}; matches the paper's "
                  f"{' > '.join(r['paper_order'])}: {verdict(r['matches_paper_order'][column])}.", ""]
    lines += energy_note({f"{c}/{m}": row for c, rows in r["methods"].items() for m, row in rows.items()})[1:]
    return "\n".join(lines) + "\n"


PRETRAINED_SETS = ("caff_pretrained", "caff_pretrained_dropout", "caff_pretrained_more_text", "caff_pretrained_5000",
                   "caff_pretrained_continued", "caff_pretrained_15000")


def render_pretrained_sets() -> str:
    """The CAFF pretrained sets side by side: what each was pretrained on and with, and its losses per depth."""
    sets = [(n, json.loads(p.read_text())) for n in PRETRAINED_SETS if (p := RESULTS / f"reproduce_{n}.json").exists()]
    if not sets:
        return "No pretrained set summarised yet: run `python bench/pretrained_set.py DIR -o ...`.\n"
    depths = sorted({int(d) for _, r in sets for d in r["depths"]})
    per_depth = " / ".join(map(str, depths))
    lines = [f"| set | corpus (characters, works) | dropout | steps (at most) | held-out loss {per_depth} | "
             f"validation loss {per_depth} | checkpoint kept {per_depth} | held-out falls with depth |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in sets:
        tokens = r.get("corpus_tokens")
        corpus = f"{tokens:,}, {len(r['works'])}" if tokens else f"{len(r['works'])} works"

        def each(key, fmt="{:.3f}"):
            return " / ".join(fmt.format(r["depths"][str(d)][key]) if str(d) in r["depths"] else "-" for d in depths)
        # a continued set's earlier stages first: "5000 + 5000" is a second schedule from the first's weights
        stages = next(iter(r["depths"].values())).get("stages", [])
        steps = " + ".join(str(s["settings"]["steps"]) for s in [*stages, {"settings": r["settings"]}])
        falls = verdict(r["held_out_loss_strictly_decreasing_with_depth"])
        if len(r["depths"]) < len(depths):
            # a set still being pretrained: its verdict covers only the depths it has
            falls = f"{' -> '.join(sorted(r['depths'], key=int))} only: {falls}"
        lines.append(f"| `{name}.json` | {corpus} | {r['settings'].get('dropout', 0.0):g} | {steps} | "
                     f"{each('held_out_loss')} | {each('validation_loss')} | {each('best_step', '{}')} | {falls} |")
    return "\n".join(lines + render_steps_in_depth(sets)) + "\n"


def render_steps_in_depth(sets: list[tuple[str, dict]]) -> list[str]:
    """For the sets measured on every test window: each step in depth as the deeper model's loss gain on the same
    windows, with its standard error, and whether the test text resolves it (gain beyond two errors)."""
    measured = [(n, r["every_test_window"], r["settings"]["context"]) for n, r in sets
                if "steps_in_depth" in r.get("every_test_window", {})]
    if not measured:
        return []
    _, every, context = measured[0]
    windows = next(v["windows"] for k, v in every.items() if k != "steps_in_depth")
    # columns keyed by depth and by step, so a set that lacks a depth lines up with the others ("-" where it has none)
    depths = sorted({int(k) for _, e, _ in measured for k in e if k != "steps_in_depth"})
    steps = sorted({s for _, e, _ in measured for s in e["steps_in_depth"]}, key=lambda s: [int(d) for d in s.split("->")])
    lines = ["", f"Every window of the test text ({windows:,} windows of {context} characters), each step in depth as "
             "the loss the deeper model gains on the same windows (negative: it loses), +- one standard error over "
             "blocks of consecutive windows; *resolved* when the gain is beyond two errors "
             "(`bench/pretrained_set.py --all-windows`):", "",
             f"| set | loss on every test window {' / '.join(map(str, depths))} | "
             + " | ".join(f"{s.replace('->', ' -> ')} layers" for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for name, every, _ in measured:
        losses = " / ".join(f"{every[str(d)]['held_out_loss']:.3f}" if str(d) in every else "-" for d in depths)
        cells = [f"{g['loss_gain']:+.4f} +- {g['standard_error']:.4f}, {g['windows_deeper_better']:.0%} of windows"
                 f"{', resolved' if g['resolved'] else ''}" if (g := every["steps_in_depth"].get(s)) else "-"
                 for s in steps]
        lines.append(f"| `{name}.json` | {losses} | " + " | ".join(cells) + " |")
    return lines


def render_caff_seeds(names: tuple[str, ...] = ("caff", "caff_seed1")) -> str:
    """Final accuracy per budget column and method at each seed, and each seed's order and verdict."""
    runs = [json.loads(p.read_text()) for p in (RESULTS / f"reproduce_{n}.json" for n in names) if p.exists()]
    if len(runs) < 2:
        return "No second seed yet: run `python bench/reproduce_caff.py --pretrained DIR --seed 1`.\n"
    return render_caff_runs([(f"seed {r['settings']['seed']}", r) for r in runs])


def render_caff_sets(runs: tuple[tuple[str, str], ...]) -> str:
    """The same columns fine-tuned from other pretrained sets: `runs` pairs a result name with its set's label.
    Each row shows start and final accuracy, since the start is what a set changes."""
    found = [(label, json.loads(p.read_text())) for name, label in runs
             if (p := RESULTS / f"reproduce_{name}.json").exists()]
    if len(found) < 2:
        return "No run on another pretrained set yet: run `python bench/reproduce_caff.py --pretrained DIR -o ...`.\n"
    return render_caff_runs(found, start=True)


def render_caff_runs(runs: list[tuple[str, dict]], start: bool = False) -> str:
    """Per budget column (the first run's) and method: each run's final accuracy (`start`: start -> final), then
    each run's order and verdict; a column or method a run lacks reads "not run"."""
    first = runs[0][1]

    def cell(r: dict, column: str, m: str) -> str:
        row = r["methods"].get(column, {}).get(m)
        if row is None:
            return "not run"
        return f"{pct(row.get('start'), 2)} -> {pct(row['final'], 2)}" if start else pct(row["final"], 2)
    what = "start -> final" if start else "final"
    lines = ["| budget | method | " + " | ".join(f"{label}, {what}" for label, _ in runs) + " |",
             "|---|---|" + "---|" * len(runs)]
    columns = sorted(first["methods"], key=lambda c: first["budgets_bytes"][c])
    for column in columns:
        for m in first["paper_order"]:
            lines.append(f"| {mib(first['budgets_bytes'][column])} | {m} | "
                         + " | ".join(cell(r, column, m) for _, r in runs) + " |")
    lines += ["", "| budget | " + " | ".join(f"{label}: ours (matches)" for label, _ in runs) + " |",
              "|---|" + "---|" * len(runs)]
    for column in columns:
        lines.append(f"| {mib(first['budgets_bytes'][column])} | "
                     + " | ".join(f"{' > '.join(r['our_order'][column])} ({verdict(r['matches_paper_order'][column])})"
                                  if column in r["our_order"] else "not run" for _, r in runs) + " |")
    return "\n".join(lines) + "\n"


def render_study_seeds(name: str) -> str:
    """A study's runs at every seed (`reproduce_<name>.json` is seed 0, `reproduce_<name>_seed<N>.json` the
    others): per method the final and best accuracy at each seed and their means, each seed's order and verdict,
    and the order of the means under the same tie rule."""
    paths = [RESULTS / f"reproduce_{name}.json"] + sorted(RESULTS.glob(f"reproduce_{name}_seed*.json"),
                                                            key=lambda p: int(p.stem.rsplit("seed", 1)[1]))
    runs = [json.loads(p.read_text()) for p in paths if p.exists()]
    if len(runs) < 2:
        return f"No second seed yet: run `python bench/reproduce_{name.split('_')[0]}.py ... --seed 1`.\n"
    seeds = [r["settings"]["seed"] for r in runs]
    order = runs[0]["paper_order"]
    methods = order + [m for m in runs[0]["methods"] if m not in order]
    lines = ["| method | paper | " + " | ".join(f"seed {s}: final (best)" for s in seeds) + " | mean final | mean best |",
             "|---|---|" + "---|" * (len(seeds) + 2)]
    means = {}
    for m in methods:
        got = [r["methods"].get(m) for r in runs]
        if any(g is None for g in got):
            lines.append(f"| {m} | {runs[0]['paper']['accuracy'].get(m, '')} | "
                         + " | ".join("not run" if g is None else f"{pct(g['final'])} ({pct(g['best'])})" for g in got)
                         + " | | |")
            continue
        means[m] = {"final": sum(g["final"] for g in got) / len(got), "best": sum(g["best"] for g in got) / len(got)}
        label = f"{m} (ceiling)" if got[0].get("ceiling") else m
        lines.append(f"| {label} | {runs[0]['paper']['accuracy'].get(m, '')} | "
                     + " | ".join(f"{pct(g['final'])} ({pct(g['best'])})" for g in got)
                     + f" | {pct(means[m]['final'])} | {pct(means[m]['best'])} |")
    lines += ["", "| seed | ours | matches |", "|---|---|---|"]
    lines += [f"| {s} | {' > '.join(r['our_order'])} | {verdict(r['matches_paper_order'])} |" for s, r in zip(seeds, runs)]
    mean = compare(means, order)
    lines += ["", f"Order of the means over seeds {', '.join(map(str, seeds))}: {' > '.join(mean['our_order'])}"
              + (f" (ties within a point: {', '.join('~'.join(t) for t in mean['ties'])})" if mean["ties"] else "")
              + f". Matches the paper's {' > '.join(order)}: {verdict(mean['matches_paper_order'])}."]
    return "\n".join(lines) + "\n"


def paper_cell(paper: dict, method: str, leader: str) -> str:
    """The paper's number for `method`: its accuracy, or where a column survives only as the leader's margins
    (ProFL's ResNet18 text), the leader's lead over it."""
    if method in paper.get("accuracy", {}):
        return str(paper["accuracy"][method])
    ahead = paper.get("ahead_by_points", {})
    if method in ahead:
        return f"{leader} -{ahead[method]}"
    return "first" if ahead and method == leader else ""


def share(settings: dict) -> str:
    """ProFL's columns are set by the share of the devices that fit the whole model; other studies' by their
    groups' budgets alone."""
    got = settings.get("full_model_share")
    return "" if got is None else f"{got:.0%} of the devices fitting the whole model, "


def render_combined(name: str) -> str:
    """A study to convergence (`reproduce_<name>.json`, written by `--combine`): per column each method's last-10
    mean (best) at every seed, their mean, whether each converged, each seed's order and the order of the means;
    evidence runs (not the paper's methods) below the ceiling."""
    path = RESULTS / f"reproduce_{name}.json"
    if not path.exists():
        return f"No result yet: run `python bench/reproduce_{name.split('_')[0]}.py ... --combine`.\n"
    out = []
    for column, c in json.loads(path.read_text())["columns"].items():
        s, seeds, order = c["settings"], sorted(c["seeds"], key=int), c["paper_order"]
        budgets = [b for seed in c["seeds"].values() for b in seed["budgets_bytes"].values()]
        out += [f"**{column}** ({s['model']}, {s['data']}, {s['train_examples']} training / {s['test_examples']} test "
                f"examples, {s['partition']}, {s['devices']} devices, {s['clients_per_round']} per round, {s['rounds']} "
                f"rounds, {share(s)}{s['runtime']} budgets "
                f"{mib(min(budgets))} to {mib(max(budgets))}"
                f"{', trained on ' + s['device'] if s.get('device') else ''}). Last-10 mean accuracy (best evaluation) in %; "
                f"converged: the last-10 mean less than a point above the best evaluation {CONVERGED_SPAN} or more rounds before "
                f"the end (its gain in points).", ""]
        out += ["| method | paper | " + " | ".join(f"seed {k}" for k in seeds) + " | mean | converged |",
                "|---|---|" + "---|" * (len(seeds) + 2)]
        names = {m for k in seeds for m in c["seeds"][k]["methods"]}
        rows = {m: [c["seeds"][k]["methods"].get(m) for k in seeds] for m in names}
        evidence = {m for m in names if any(r and r.get("evidence") for r in rows[m])}
        for m in order + sorted(names - set(order), key=lambda m: (m in evidence, m)):
            got = rows.get(m, [None] * len(seeds))
            first = next((r for r in got if r), {})
            label = m + (" (ceiling)" if first.get("ceiling") else " (evidence)" if first.get("evidence") else "")
            mean = c["mean"]["methods"].get(m, {}).get("final_last10")
            conv = ", ".join("n/a" if not r or not r.get("converged") else
                             f"{'yes' if r['converged']['converged'] else '**no**'} "
                             f"({round(100 * r['converged']['gain_over_last_rounds'], 1) + 0.0:+.1f})" for r in got)
            out.append(f"| {label} | {paper_cell(c['paper'], m, order[0])} | "
                       + " | ".join("not run yet" if not r else f"{pct(r.get('final_last10'))} ({pct(r['best'])})"
                                    for r in got) + f" | {pct(mean)} | {conv} |")
        out += [""] + [f"Seed {k}: {' > '.join(c['seeds'][k]['our_order']) or 'none yet'}. Matches the paper's "
                       f"{' > '.join(order)}: {verdict(c['seeds'][k]['matches_paper_order'])}." for k in seeds]
        out += ["", f"Mean over seeds {', '.join(c['mean']['seeds'])}: {' > '.join(c['mean']['our_order']) or 'none yet'}"
                + (f" (ties within a point: {', '.join('~'.join(t) for t in c['mean']['ties'])})"
                   if c["mean"]["ties"] else "") + f". Matches: {verdict(c['mean']['matches_paper_order'])}.", ""]
    return "\n".join(out)


def paper_column(accuracy: dict, i: int) -> dict:
    """The paper's i-th memory column (tightest first), set beside ours of the same rank (CAFF's Table 1 has
    500 / 700 / 900 MB; ours are the last 1 / 2 / 4 blocks)."""
    columns = list(accuracy.values())
    return columns[i] if i < len(columns) else {}


def render_slt() -> str:
    r = json.loads((RESULTS / "reproduce_slt.json").read_text())
    lines = ["| setting | SLT | small | FedRolex | FD | ceiling (FedAvg) | ours | matches |", "|---|---|---|---|---|---|---|---|"]
    for setting, rows in r["settings"].items():
        if setting.endswith("ceiling"):
            continue
        ceiling = r["settings"].get(setting.split("/")[0] + "/ceiling", {}).get("fedavg", {}).get("final")
        lines.append(f"| {setting} | " + " | ".join(pct(rows.get(m, {}).get("final")) for m in ("slt", "small", "fedrolex", "fd"))
                     + f" | {pct(ceiling)} | {' > '.join(r['orderings'][setting])} | "
                       f"{verdict(r['matches_paper_order'].get(setting))} |")
    return "\n".join(lines) + "\n"


RENDER = {"slt": render_slt, "caff": render_caff, "caff_seeds": render_caff_seeds,
          "caff_pretrained_sets": render_pretrained_sets,
          "caff_block_budgets": lambda: render_caff("caff_block_budgets", pretrained_table=False),
          "caff_first_set": lambda: render_caff("caff_first_set"),
          "caff_first_set_seeds": lambda: render_caff_seeds(("caff_first_set", "caff_first_set_seed1")),
          "caff_sets": lambda: render_caff_sets((("caff_continued", "continued set"), ("caff", "15,000-step set"))),
          "caff_continued_seeds": lambda: render_caff_seeds(("caff_continued", "caff_continued_seed1")),
          **{n: (lambda n=n: render_study(n)) for n in ("fedolf", "fedolf_mnist", "fedolf_dirichlet", "fedepth",
                                                        "profl_25rounds")},
          **{n: (lambda n=n: render_combined(n)) for n in ("profl", "fedepth_convergence", "fedolf_convergence")},
          **{f"{n}_seeds": (lambda n=n: render_study_seeds(n)) for n in ("fedolf_mnist", "fedolf_dirichlet")}}


def main() -> None:
    text = DOC.read_text()
    unknown = [m.group(2) for m in BLOCK.finditer(text) if m.group(2) not in RENDER]
    if unknown:
        sys.exit(f"{DOC}: result blocks {unknown} have no renderer (known: {', '.join(RENDER)})")
    DOC.write_text(BLOCK.sub(lambda m: m.group(1) + RENDER[m.group(2)]() + m.group(3), text))
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
