"""A coordinator killed mid-round resumes from its state folder and ends where an uninterrupted run ends,
and a report it had accepted before dying is aggregated without asking the device again."""
import pytest
import torch

from edgefl.data import parse_partition
from edgefl.engines.local import emulate
from edgefl.fleet import parse_fleet
from edgefl.planning.plan import verify
from edgefl.planning.strategies import PlanContext, get_strategy
from edgefl.server.coordinator import LoopSettings
from edgefl.server.runstate import RunState
from edgefl.zoo import ModelRef

pytestmark = pytest.mark.usefixtures("one_thread")


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs, no handler catches it."""


def _run(data, fleet_text, state=None, method="fedolf", rounds=4):
    train, test = data
    fleet = parse_fleet(fleet_text)
    strategy = get_strategy(method)
    plan = verify(strategy.plan(PlanContext(fleet, ModelRef.of("cnn"), rounds=rounds, batch_size=32)), fleet)
    shares = parse_partition("iid").split(train.y, fleet.device_count, 0)
    return emulate(fleet, plan, strategy, plan.model, train, test, shares,
                   LoopSettings(rounds=rounds, clients_per_round=4, lr=0.05, seed=0), state=state)


def test_resume_after_a_kill_mid_round_matches_an_uninterrupted_run(data, fleet_text, tmp_path, monkeypatch):
    reference_records, reference = _run(data, fleet_text)

    journal = RunState.journal
    seen = []

    def journal_then_die(self, report):
        journal(self, report)
        seen.append((report.round, report.device_id))
        if report.round == 3:
            raise Killed()
    monkeypatch.setattr(RunState, "journal", journal_then_die)
    with pytest.raises(Killed):
        _run(data, fleet_text, RunState(tmp_path))
    monkeypatch.setattr(RunState, "journal", journal)
    killed_in_round_3 = [d for r, d in seen if r == 3]
    assert len(killed_in_round_3) == 1
    assert [r.device_id for r in RunState(tmp_path).journaled(3)] == killed_in_round_3

    asked = []
    from edgefl.transport.memory import InMemoryTransport
    send = InMemoryTransport.send
    monkeypatch.setattr(InMemoryTransport, "send",
                        lambda self, ins, *rest: (asked.append((ins.round, ins.device_id)), send(self, ins, *rest))[1])
    records, resumed = _run(data, fleet_text, RunState(tmp_path))

    assert [r.round for r in records] == [1, 2, 3, 4]
    assert min(r for r, _ in asked) == 3                      # rounds 1-2 came from the checkpoint
    assert (3, killed_in_round_3[0]) not in asked             # its journaled report was not asked for again
    assert records[2].participating == reference_records[2].participating
    for key, value in reference.state.items():
        torch.testing.assert_close(resumed.state[key], value, rtol=0, atol=0)
    assert RunState(tmp_path).load()[0] == 4
