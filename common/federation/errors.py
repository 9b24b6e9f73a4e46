"""The error a plan is refused with (common/federation/plan.py and the modules that check a plan's parts)."""
from __future__ import annotations

from fedsbdt.common.config import ConfigError


class PlanError(ConfigError):
    """The plan is malformed, inconsistent, or its privacy statement does not check out."""
