"""Who the guarantee holds against: the collusion bound in terms of the plan's declared c (pure functions).

Notation (docs/threat-model.md "What t and c mean"): n roster sites, threshold
t, declared colluders c (``assumed_colluders``), dropout slack s.  A plan is
accepted only if ``0 ≤ c`` and ``2t > n + c`` and ``0 ≤ s ≤ n − t``.

*The split attack* (issue 10): in one round the coordinator shows survivor
set U_A = P_r to some sites and U_B = P_r ∖ {v} to the others.  Every honest
site signs one set, colluders sign both; if both sets reach t signatures, the
signers of U_A reveal their shares of v's self-mask seed and those of U_B
their shares of v's mask key, and v's masked input is opened: its data plus
(distributed mode) its own noise share.  With k colluders both sets reach t
signatures iff the honest sites split into two groups of ≥ t − k each (v on
the U_A side), i.e. iff ``2t ≤ n + k`` — and only if a survivor set without v
is acceptable at all, i.e. ``s ≥ 1`` (with s = 0 a site signs only U = P_r).
Hence k ≤ c colluders never succeed (2t > n + c), and c + 1 succeed iff
``2t = n + c + 1`` and ``s ≥ 1`` — always the case for the default c.
"""
from __future__ import annotations


def secagg_collusion_limit(n: int, t: int) -> int:
    """The most colluders under which no two survivor sets both reach t signatures: 2t − n − 1."""
    return 2 * t - n - 1


def default_colluders(n: int, t: int) -> int:
    """The planner's default c for a given t: the largest c the threshold rule 2t > n + c allows.

    It is also the largest c whose noise divisor stays ≥ 1: k_r ≥ t − c = n + 1 − t ≥ 1.
    """
    return max(0, secagg_collusion_limit(n, t))


def split_attack_possible(n: int, t: int, s: int, colluders: int) -> bool:
    """Whether the split attack opens one honest site's input with ``colluders`` colluding sites.

    Needs an honest victim (colluders < n), a survivor set without it that honest sites sign
    (s ≥ 1 and n − 1 ≥ t), and two groups of signers: max(1, t − k) + max(0, t − k) ≤ n − k honest
    sites (the victim signs the set that contains it).
    """
    k = colluders
    if k >= n or s < 1 or n - 1 < t:
        return False
    return max(1, t - k) + max(0, t - k) <= n - k


def collusion_guarantee(n: int, t: int, c: int, s: int, noise: str) -> str:
    """One paragraph stating exactly whom the guarantee covers (plan output, model report)."""
    what = ("every sum the coordinator can unmask covers ≥ t sites and carries at least the full DP noise from "
            "honest sites, so the (ε, δ) guarantee holds against the coordinator and those sites"
            if noise == "distributed" else
            "the coordinator sees only un-noised sums over ≥ t sites (never one site's vector) and must be "
            "trusted to add the noise; the (ε, δ) guarantee holds against everyone else")
    out = (f"Holds if at most c = {c} of the {n} sites collude with the coordinator (t = {t}, dropout slack "
           f"s = {s}): {what}.")
    if split_attack_possible(n, t, s, c + 1):
        out += (f" With {c + 1} colluder{'s' if c else ''} it does not hold: showing two survivor sets to two "
                "halves of the sites opens one site's masked input.")
    else:
        out += f" With more than {c} colluders nothing is claimed."
    return out
