"""An evaluation-only plan (``fedsbdt plan --evaluate-model M``): the existing model's trees are released from
the start, and the only round is the evaluation — the schedule has no INIT_SCORE, TREE, LEVEL or SKETCH
round, so the gate refuses them whatever the coordinator asks.  The model the site evaluates must be the one
the plan pins (client/gate.py checks its content digest before the evaluation input and at Finished)."""
from __future__ import annotations

from fedsbdt.common.modes import EVALUATION, register, tree_builder
from fedsbdt.common.modes.base import Mode


class EvaluationOnly(Mode):
    name = EVALUATION
    is_tree_builder = False  # not a --tree-builder choice

    def trains(self, plan) -> bool:
        return False

    def tree_budget(self, plan):  # pragma: no cover - trains nothing
        return {}

    # ---- site side
    def site_rounds(self, ctx):
        """The model's released trees are checked as those of the plan's tree builder (its mode's site rounds);
        the gate refuses every training round before it reaches them."""
        return tree_builder(ctx.plan.hyperparameters.tree_builder).site_rounds(ctx)


register(EvaluationOnly())
