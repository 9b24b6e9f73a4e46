"""The coordinator side of a mode (common/modes/coordinator.py): the session asks the plan's mode for the rounds of
a tree, and a tree in progress rebuilt from its checkpoint records is the live one."""
from __future__ import annotations

import numpy as np
import pytest

from fedsbdt.common.federation.plan import SiteEntry, make_plan
from fedsbdt.common.federation.wire import Purpose
from fedsbdt.common.modes import mode_for, training_mode
from fedsbdt.server.checkpoint import CheckpointError, CoordinatorStore

from .conftest import abalone_with_ids
from .test_dpboost_federation import dpboost_hp
from .test_greedy_federation import greedy_hp
from .test_sarus_federation import sarus_hp
from .test_state_machines import tree_hp

SITES = [SiteEntry(f"s{i}", bytes([i + 1]) * 32) for i in range(3)]


def _plan(hp):
    schema, _ = abalone_with_ids(30)
    return make_plan(schema, hp, SITES)


def _tree(rounds, rng):
    """Run the rounds of one tree on random noisy sums: the (purpose, level) schedule, the steps' records."""
    schedule, records = [], []
    for _ in range(2 * rounds.hp.depth + 2):  # a tree has at most sketch, levels and leaves
        purpose, level = rounds.next_round()
        schedule.append((purpose, level))
        d = rounds.vector_len(purpose, 0, level)
        noisy = rng.integers(-50, 10**8, d).astype(np.int64)  # counts large enough to split
        if purpose == Purpose.TREE:
            values, splits = rounds.leaf_values(noisy, 0), rounds.splits(0)
            restored = mode_for(rounds.plan).coordinator_rounds(rounds.plan, records)
            assert np.array_equal(restored.leaf_values(noisy, 0), values)
            assert np.array_equal(restored.splits(0).thresholds, splits.thresholds)
            return schedule, records, values, splits
        step = rounds.release(purpose, 0, level, noisy)
        assert rounds.next_round() == (purpose, level)  # release alone changes nothing: the session checkpoints first
        rounds.apply(step.kind, step.record)
        records.append((step.kind, {"tree": 0, "level": level} | step.record))
        restored = mode_for(rounds.plan).coordinator_rounds(rounds.plan, records)  # a coordinator restart here
        assert restored.next_round() == rounds.next_round()
        purpose, level = rounds.next_round()
        assert restored.request(purpose, 0, level) == rounds.request(purpose, 0, level)
        assert restored.rounds_left(3) == rounds.rounds_left(3)
    raise AssertionError(f"no leaf round after {schedule}")


@pytest.mark.parametrize("hp, schedule", [
    (greedy_hp(), [(Purpose.LEVEL, 0), (Purpose.LEVEL, 1), (Purpose.TREE, 0)]),
    (dpboost_hp(), [(Purpose.LEVEL, 0), (Purpose.LEVEL, 1), (Purpose.TREE, 0)]),
    (sarus_hp(depth=2), [(Purpose.SKETCH, 0), (Purpose.LEVEL, 0), (Purpose.LEVEL, 1), (Purpose.TREE, 2)]),
], ids=["greedy", "dpboost", "sarus"])
def test_a_tree_s_rounds_come_from_the_mode_and_a_restart_resumes_them(hp, schedule):
    plan = _plan(hp)
    rounds = mode_for(plan).coordinator_rounds(plan)
    got, records, values, splits = _tree(rounds, np.random.default_rng(1))
    assert got == schedule
    assert splits.features.size == 2**hp.depth - 1 and values.size == 2**hp.depth
    assert np.array_equal(splits.features, rounds.chosen_splits()[0])  # the released tree has the chosen splits
    rounds.reset()
    assert rounds.next_round() == schedule[0] and rounds.levels == []


def test_random_trees_have_one_leaf_round_per_tree_on_the_public_splits():
    from fedsbdt.common.splits import random_splits

    plan = _plan(tree_hp())
    rounds = mode_for(plan).coordinator_rounds(plan)
    assert rounds.next_round() == (Purpose.TREE, 0) and rounds.request(Purpose.TREE, 4, 0) == {}
    assert rounds.rounds_left(5) == 5
    hp = plan.hyperparameters
    want = random_splits(plan.schema, hp.depth, hp.seed, 4, hp.cyclical, hp.split_candidates)
    assert np.array_equal(rounds.splits(4).thresholds, want.thresholds)
    with pytest.raises(ValueError, match="level rounds are not rounds"):
        rounds.release(Purpose.LEVEL, 0, 0, np.zeros(3, np.int64))


def test_fedsbdt_plan_takes_the_mode_s_federation_defaults():
    hp = greedy_hp(selection="exponential")
    assert training_mode(hp).federated_hyperparameters(hp, {}).selection == "histogram"
    assert training_mode(hp).federated_hyperparameters(hp, {"selection": "exponential"}).selection == "exponential"
    hp = dpboost_hp()
    assert training_mode(hp).federated_hyperparameters(hp, {}) == hp


def test_the_checkpoint_refuses_steps_out_of_order(tmp_path):
    def store_with(*steps):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        store = CoordinatorStore(d, "ab" * 32)
        store.load()
        for kind, level in steps:
            store.append_step(kind, 0, level, 7, ["a"], {"features": [], "thresholds": []}, 0)
        store.close()
        return CoordinatorStore(d, "ab" * 32)

    ok = store_with(("sketch", 0), ("level", 0), ("level", 1)).load()
    assert [(k, r.get("level")) for k, r in ok.steps] == [("sketch", None), ("level", 0), ("level", 1)]
    with pytest.raises(CheckpointError, match="level 1 of tree 0 out of order"):
        store_with(("level", 1)).load()
    with pytest.raises(CheckpointError, match="sketch of tree 0 out of order"):
        store_with(("sketch", 0), ("sketch", 0)).load()
    with pytest.raises(ValueError, match="not a step kind"):
        store_with(("tree", 0))
