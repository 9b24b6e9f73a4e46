"""A site's own policy on the plans it takes part in (``fedsbdt client`` flags), checked before joining.

The plan's hash pins what the site agreed to out of band; the policy is what
the site accepts *whatever* it was told: a coordinator that serves (and gets
pinned) a plan with a roster of the victim and a sybil whose key it holds, a
threshold of two and central noise reads the victim's exact sums.  Hence the
defaults: central noise only with an explicit opt-in, and at least
:data:`MIN_SITES` sites in the roster.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedsbdt.common.config import ConfigError
from fedsbdt.common.lifetime import (DEFAULT_LIFETIME_DELTA, DEFAULT_LIFETIME_EPSILON, DEFAULT_POPULATION,
                                      LifetimeError, check_lifetime_delta, check_population)

if TYPE_CHECKING:
    from fedsbdt.common.federation.plan import Plan

#: Defaults of ``--min-sites``, ``--min-threshold``, ``--min-colluders``.  Two sites is a site alone with one
#: other party, which may be a sybil; t ≥ 2 and c ≥ 0 are what every valid plan has already.
MIN_SITES, MIN_THRESHOLD, MIN_COLLUDERS = 3, 2, 0
#: Default of ``--max-failed-attempts``: how often the coordinator may fail one round after this site answered it
#: (each retry that carries data spends budget) before the site leaves the session.
MAX_FAILED_ATTEMPTS = 3
#: Default of ``--max-failed-attempts-per-session``: one failed attempt per this many of the plan's trees (a tenth,
#: rounded up), at least ``--max-failed-attempts``.  Each failed attempt that carried data spends one of the
#: releases the plan schedules for the records it read, so up to that many of the last trees may carry no data from
#: this site: the default bounds that loss at a tenth of the site's contribution, while a long session still
#: survives the occasional dropout or coordinator restart (each fails one attempt of one round).
SESSION_TREES_PER_FAILED_ATTEMPT = 10
#: Default of ``--max-eval-epsilon``: the largest ε_eval of a plan's federated evaluation a site accepts.
MAX_EVAL_EPSILON = 1.0


@dataclass(frozen=True)
class SitePolicy:
    """The plans a site accepts.

    Attributes:
        allow_central_noise: accept central noise, where the sites add no noise and the coordinator sees
            the exact sum of the sites' vectors (``--allow-central-noise``).
        min_sites: the smallest roster n accepted (``--min-sites``).
        min_threshold: the smallest secure-aggregation threshold t accepted (``--min-threshold``).
        min_colluders: the smallest declared colluder count c accepted (``--min-colluders``).
        max_failed_attempts: failed attempts of one round the site tolerates before it leaves
            (``--max-failed-attempts``).
        max_failed_attempts_per_session: failed attempts of all rounds together
            (``--max-failed-attempts-per-session``; None: :meth:`session_failure_limit`'s default for the plan).
        lifetime_epsilon: the lifetime ε cap of the population's account (``--lifetime-epsilon``;
            common/lifetime.py).
        lifetime_delta: the δ at which the lifetime ε is computed (``--lifetime-delta``).
        population: the account every release is charged to (``--population``; default: the site's one account).
    """

    allow_central_noise: bool = False
    min_sites: int = MIN_SITES
    min_threshold: int = MIN_THRESHOLD
    min_colluders: int = MIN_COLLUDERS
    max_failed_attempts: int = MAX_FAILED_ATTEMPTS
    lifetime_epsilon: float = DEFAULT_LIFETIME_EPSILON
    max_failed_attempts_per_session: int | None = None
    lifetime_delta: float = DEFAULT_LIFETIME_DELTA
    population: str = DEFAULT_POPULATION

    def __post_init__(self) -> None:
        if isinstance(self.lifetime_epsilon, bool) or not (isinstance(self.lifetime_epsilon, (int, float))
                                                           and self.lifetime_epsilon > 0):
            raise ConfigError(f"--lifetime-epsilon must be > 0 (got {self.lifetime_epsilon!r})")
        try:
            check_lifetime_delta(self.lifetime_delta)
            check_population(self.population)
        except LifetimeError as e:
            raise ConfigError(str(e)) from None
        for name, low in (("min_sites", 2), ("min_threshold", 1), ("min_colluders", 0), ("max_failed_attempts", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"--{name.replace('_', '-')} must be an integer ≥ {low} (got {v!r})")
        v = self.max_failed_attempts_per_session
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"--max-failed-attempts-per-session must be an integer ≥ 0 (got {v!r})")

    def session_failure_limit(self, plan: "Plan") -> int:
        """Failed attempts of all rounds of ``plan`` together this site tolerates: the flag's value, or by default a
        tenth of the plan's trees (rounded up), at least ``--max-failed-attempts``."""
        if self.max_failed_attempts_per_session is not None:
            return self.max_failed_attempts_per_session
        trees = plan.hyperparameters.total_rounds
        return max(self.max_failed_attempts, -(-trees // SESSION_TREES_PER_FAILED_ATTEMPT))

    def refusal(self, plan: "Plan") -> str | None:
        """Why this policy refuses ``plan`` (one sentence naming the flag), or None if it accepts it."""
        if plan.noise == "central" and not self.allow_central_noise:
            return ("the plan uses central noise: the coordinator would see the exact sum of the sites' "
                    "vectors; refusing to take part (pass --allow-central-noise to accept that)")
        if plan.n < self.min_sites:
            return (f"the plan's roster has {plan.n} sites ({', '.join(plan.site_ids)}), fewer than this site's "
                    f"--min-sites {self.min_sites}; refusing to take part")
        if plan.threshold < self.min_threshold:
            return (f"the plan's threshold t = {plan.threshold} is below this site's --min-threshold "
                    f"{self.min_threshold}; refusing to take part")
        if plan.assumed_colluders < self.min_colluders:
            return (f"the plan assumes c = {plan.assumed_colluders} colluding sites, fewer than this site's "
                    f"--min-colluders {self.min_colluders}; refusing to take part")
        return None
