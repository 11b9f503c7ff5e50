"""SLT's step -> round mapping (eq. 5/6) against values computed by hand for the 2-conv CNN."""
from edgefl.fleet import parse_fleet
from edgefl.planning.strategies.base import PlanContext
from edgefl.planning.strategies.slt import round_schedule, slt_config, trained_share
from edgefl.zoo import ModelRef

# CNN layers (P_k -> M_k, with biases): conv5x5 1->32, conv5x5 32->64, fc 3136->512, fc 512->10
FULL = [32 * 25 + 32, 64 * 32 * 25 + 64, 3136 * 512 + 512, 512 * 10 + 10]


def _ctx(store):
    fleet = parse_fleet("fleet: {groups: {a: {count: 1, memory_budget: 1GiB}}}")
    return PlanContext(fleet, ModelRef.of("cnn"), rounds=100, store=store)


def test_trained_share_matches_eq5_by_hand(store):
    ctx = _ctx(store)
    # pre-training at s = 0.25: every layer scaled, input channels and classes kept
    pre = (8 * 25 + 8) + (16 * 8 * 25 + 16) + (16 * 49 * 128 + 128) + (128 * 10 + 10)
    assert trained_share(ctx, 0, 0.25) == pre
    # step 1 (K_F = 0, K_T = 1) at s = 0.5: conv1 full, conv2 32 -> 32, fc1 (32*49) -> 256, fc2 256 -> 10
    step1 = FULL[0] + (32 * 32 * 25 + 32) + (32 * 49 * 256 + 256) + (256 * 10 + 10)
    assert trained_share(ctx, 1, 0.5) == step1
    # step 2 at s = 0.5: conv1, conv2 already filled (cumulative), fc1 3136 -> 256, fc2 256 -> 10
    step2 = FULL[0] + FULL[1] + (3136 * 256 + 256) + (256 * 10 + 10)
    assert trained_share(ctx, 2, 0.5) == step2
    assert trained_share(ctx, 3, 1.0) == sum(FULL)


def test_round_schedule_eq6_by_hand():
    total = sum(FULL)
    assert total == 1_663_370
    shares = [10_000, 100_000, 900_000, total]
    # r_n = R * Q_n / Q(0,0,1): 200 * 10000 / 1663370 = 1.20 -> 1; 12.02 -> 12; 108.2 -> 108; the last ends at R
    assert round_schedule(200, shares, total) == [(1, 1), (2, 12), (13, 108), (109, 200)]


def test_round_schedule_covers_all_rounds_and_allows_empty_steps():
    ranges = round_schedule(10, [1, 2, 3, 100], 100)
    assert ranges[0] == (1, 0)              # a share below half a round gets no round
    assert ranges[-1][1] == 10
    covered = [r for a, b in ranges for r in range(a, b + 1)]
    assert covered == list(range(1, 11))


def test_slt_config_layout(store):
    ctx = _ctx(store)
    c = slt_config(ctx, 2, 0.5)
    assert (c.frozen_prefix, c.head_start, c.head_width) == (1, 2, 0.5)
    assert c.widths == (1.0, 1.0, 0.5, 0.5)
    assert slt_config(ctx, 3, 0.5).head_width == 1.0   # only the classifier is left: nothing to scale
