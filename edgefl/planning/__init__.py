"""Planning: per device group and round, what each device trains (frozen prefix, trained layers, widths,
auxiliary heads) so that its predicted cost fits its budgets.

`plan` (Plan, GroupPlan, Step and `verify`, which rejects any step over a budget), `strategies/` (one file per
method, on a shared base), `progress` (ProFL's freezing rule), `planner` (a method's strategy over a fleet,
verified: what the commands plan with), `calibration` (what a served run says about the plan it ran).
"""
from edgefl import lazy_exports

_WHERE = {
    "Plan": ".plan", "GroupPlan": ".plan", "Step": ".plan", "verify": ".plan", "violations": ".plan",
    "Strategy": ".strategies", "PlanContext": ".strategies", "STRATEGIES": ".strategies",
    "get_strategy": ".strategies", "method_names": ".strategies",
    "strategy_for": ".planner", "plan_fleet": ".planner",
    "samples_from_run": ".calibration", "plan_changes": ".calibration",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE, globals())
