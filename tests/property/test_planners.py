"""Planner properties on random fleets (hypothesis)."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgefl.fleet import parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import STRATEGIES, PlanContext, get_strategy
from edgefl.planning.strategies.caff import CAFF, architectures
from edgefl.zoo import ModelRef

MiB = 2**20
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fleets(draw, max_groups=4, upload=True, flops=True):
    n = draw(st.integers(1, max_groups))
    lines = ["fleet:", "  groups:"]
    for i in range(n):
        fields = [f"count: {draw(st.integers(1, 50))}",
                  f"memory_budget: {draw(st.integers(40, 1500))}MiB",
                  f"runtime: {draw(st.sampled_from(['ort', 'torch', 'executorch']))}"]
        if upload and draw(st.booleans()):
            fields.append(f"upload_budget: {draw(st.integers(5, 5000))}kB")
        if flops and draw(st.booleans()):
            fields += [f"flops_budget: {draw(st.integers(1, 2000))}GFLOP", f"examples: {draw(st.integers(10, 600))}"]
        lines.append(f"    g{i}: {{{', '.join(fields)}}}")
    return parse_fleet("\n".join(lines))


def _check(plan, fleet, ctx):
    verify(plan, fleet)
    for g in fleet.groups:
        gp = plan.groups[g.name]
        assert gp.min_memory_bytes > 0
        for step in gp.steps:
            if not step.sequence:
                assert step.predicted == ctx.with_model(plan.model).cost(step.config, g.runtime)
            assert step.predicted.peak_memory_bytes <= g.memory_budget_bytes


@SETTINGS
@given(fleet=fleets(), method=st.sampled_from(sorted(STRATEGIES)), model=st.sampled_from(["resnet20", "cnn"]),
       batch=st.sampled_from([8, 32]))
def test_every_plan_passes_verify(store, fleet, method, model, batch):
    ctx = PlanContext(fleet, ModelRef.of(model), rounds=50, batch_size=batch, store=store)
    _check(get_strategy(method).plan(ctx), fleet, ctx)


@SETTINGS
@given(fleet=fleets(upload=False, flops=False))
def test_slt_head_widths_never_shrink(store, fleet):
    ctx = PlanContext(fleet, ModelRef.of("resnet20"), rounds=200, store=store)
    plan = get_strategy("slt").plan(ctx)
    _check(plan, fleet, ctx)
    for g in plan.groups.values():
        widths = [s.config.head_width for s in g.steps]
        assert widths == sorted(widths)
        layers = [s.config.head_start or 0 for s in g.steps]
        assert layers == sorted(layers)          # K_T moves from the first layer to the last


@SETTINGS
@given(low=st.integers(40, 900), extra=st.integers(0, 600), runtime=st.sampled_from(["ort", "torch"]),
       model=st.sampled_from(["resnet20", "cnn"]))
def test_fedolf_frozen_prefix_is_monotone_in_budget(store, low, extra, runtime, model):
    fleet = parse_fleet(f"fleet: {{groups: {{lo: {{count: 1, memory_budget: {low}MiB, runtime: {runtime}}}, "
                        f"hi: {{count: 1, memory_budget: {low + extra}MiB, runtime: {runtime}}}}}}}")
    ctx = PlanContext(fleet, ModelRef.of(model), store=store)
    plan = get_strategy("fedolf").plan(ctx)
    lo, hi = plan.groups["lo"], plan.groups["hi"]
    if not lo.excluded:
        assert not hi.excluded
        assert hi.steps[0].config.frozen_prefix <= lo.steps[0].config.frozen_prefix
        # l_k is the smallest prefix that fits: one layer less would not fit
        k = lo.steps[0].config.frozen_prefix
        if k > 0:
            assert not ctx.fits(ctx.config(frozen_prefix=k - 1), fleet.group("lo"))


LM = ModelRef.of("transformer", layers=6)


def _caff(store, groups: str, batch=8):
    fleet = parse_fleet(f"fleet: {{groups: {{{groups}}}}}")
    ctx = PlanContext(fleet, LM, batch_size=batch, store=store)
    return ctx, fleet, CAFF().plan(ctx)


@SETTINGS
@given(budgets=st.lists(st.integers(1, 4000), min_size=1, max_size=3))
def test_caff_picks_deepest_under_pure_upload_budgets(store, budgets):
    groups = ", ".join(f"g{i}: {{count: 2, memory_budget: 64GiB, upload_budget: {b}kB, runtime: ort}}"
                       for i, b in enumerate(budgets))
    ctx, fleet, plan = _caff(store, groups)
    if any(not g.excluded for g in plan.groups.values()):
        # upload counts trained tensors only, so training t layers costs the same at every depth
        assert plan.model.args["layers"] == 12


@SETTINGS
@given(budgets=st.lists(st.integers(80, 3000), min_size=1, max_size=3))
def test_caff_picks_deepest_under_pure_memory_budgets(store, budgets):
    groups = ", ".join(f"g{i}: {{count: 2, memory_budget: {b}MiB, runtime: ort}}" for i, b in enumerate(budgets))
    ctx, fleet, plan = _caff(store, groups)
    if all(g.excluded for g in plan.groups.values()) or plan.model.args["layers"] == 12:
        return
    # a shallower pick is legitimate only where the deepest model's frozen weights (the one memory cost
    # that grows with depth: the weights and the runtime's copies of them) push some device below the number
    # of layers it trains in the pick
    deep = ctx.with_model(ModelRef.of("transformer", layers=12))
    chosen = ctx.with_model(plan.model)
    tipped = False
    for g in fleet.groups:
        steps = plan.groups[g.name].steps
        if not steps:
            continue
        t = chosen.num_layers - 1 - steps[0].config.frozen_prefix
        c_deep = deep.cost(deep.config(frozen_prefix=deep.num_layers - 1 - t), g.runtime)
        c_chosen = chosen.cost(steps[0].config, g.runtime)
        copies = 1 + ctx.constants[g.runtime].for_model("transformer").frozen_weight_copies
        grown = copies * (c_deep.weights_frozen_bytes - c_chosen.weights_frozen_bytes)
        assert abs(c_deep.peak_memory_bytes - c_chosen.peak_memory_bytes - grown) <= 2, (c_deep, c_chosen)
        tipped |= c_deep.peak_memory_bytes > g.memory_budget_bytes
    assert tipped


@SETTINGS
@given(slack=st.floats(0.0, 0.9))
def test_caff_picks_shallower_under_tight_flop_budgets(store, slack):
    # a budget between training 1 and 2 layers of the 12-layer model
    deep = PlanContext(parse_fleet("fleet: {groups: {x: {count: 1, memory_budget: 64GiB}}}"),
                       ModelRef.of("transformer", layers=12), batch_size=8, store=store)
    one = deep.cost(deep.config(frozen_prefix=deep.num_layers - 2), "ort").flops_per_sample
    two = deep.cost(deep.config(frozen_prefix=deep.num_layers - 3), "ort").flops_per_sample
    budget = (one + slack * (two - one)) * 100
    ctx, fleet, plan = _caff(store, f"g: {{count: 3, memory_budget: 64GiB, flops_budget: {budget:.0f}, "
                                    "examples: 100, runtime: ort}")
    assert plan.model.args["layers"] < 12
    assert not plan.groups["g"].excluded


def test_caff_architecture_set_defaults_to_paper_depths():
    assert [r.args["layers"] for r in architectures(LM)] == [3, 6, 9, 12]
    assert architectures(ModelRef.of("cnn")) == [ModelRef.of("cnn")]
