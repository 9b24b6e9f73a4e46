"""Replay and order: stages out of order, old ids, a round re-used with a new participant set,
a wrong session digest, and site restarts at every point (via the storage interface)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fedsbdt.common.secagg import (
    FileStorage,
    InvalidMessage,
    MemoryStorage,
    OutOfOrder,
    ReplayError,
    SecAggCoordinator,
    StorageError,
)
from fedsbdt.common.secagg import messages as M

from .conftest import make_config, make_federation, plain_sum, random_inputs

DIM = 4


def test_site_stages_out_of_order():
    fed = make_federation(3, 2)
    coord = fed.coordinator
    site = fed.sites["site-00"]
    setup, ann = coord.begin_epoch(2)
    d = fed.config.digest
    with pytest.raises(OutOfOrder, match="not announced"):
        site.handle_epoch_roster(M.EpochRoster(d, 0, ()))
    with pytest.raises(OutOfOrder, match="not announced"):
        site.handle_epoch_shares(M.EpochShares(d, 0, "site-00", ()))
    adverts = {s: fed.sites[s].handle_epoch_announce(ann) for s in fed.config.site_ids}
    with pytest.raises(OutOfOrder, match="EpochShares is not expected"):
        site.handle_epoch_shares(M.EpochShares(d, 0, "site-00", ()))
    start = M.RoundStart(d, 0, 0, DIM, fed.config.site_ids)
    with pytest.raises(OutOfOrder, match="not set up"):
        site.handle_round_start(start, np.zeros(DIM, dtype=np.int64))
    creq = M.ConsistencyRequest(d, 0, 0, fed.config.site_ids)
    with pytest.raises(OutOfOrder, match="has not started"):
        site.handle_consistency_request(creq)
    for a in adverts.values():
        setup.receive_advertise(a)
    with pytest.raises(OutOfOrder):
        setup.close_share_keys()
    roster = setup.close_advertise()
    with pytest.raises(OutOfOrder):
        setup.receive_advertise(adverts["site-00"])
    with pytest.raises(OutOfOrder):
        setup.close_advertise()
    sks = {s: fed.sites[s].handle_epoch_roster(roster) for s in roster.senders}
    for sk in sks.values():
        setup.receive_share_keys(sk)
    for s, m in setup.close_share_keys().items():
        fed.sites[s].handle_epoch_shares(m)
    with pytest.raises(OutOfOrder):
        setup.receive_share_keys(sks["site-00"])
    rnd, start = coord.begin_round(DIM)
    x = np.zeros(DIM, dtype=np.int64)
    y = site.handle_round_start(start, x)
    ureq = M.UnmaskRequest(d, 0, start.round_id, fed.config.site_ids, (), ())
    with pytest.raises(OutOfOrder, match="UnmaskRequest is not expected"):
        site.handle_unmask_request(ureq)
    # coordinator-side order
    with pytest.raises(OutOfOrder):
        rnd.close_consistency()
    with pytest.raises(OutOfOrder):
        rnd.finalize()
    rnd.receive(y)
    for s in ("site-01", "site-02"):
        rnd.receive(fed.sites[s].handle_round_start(start, x))
    creq = rnd.close_inputs()
    sig = site.handle_consistency_request(creq)
    with pytest.raises(OutOfOrder, match="MaskedInput is not accepted"):
        rnd.receive(y)
    with pytest.raises(OutOfOrder):
        rnd.close_inputs()
    rnd.receive(sig)
    with pytest.raises(InvalidMessage, match="a site does not accept"):
        site.handle(sig)


def test_old_round_ids_and_reused_rounds_are_refused():
    fed = make_federation(4, 3)
    fed.run_epoch(4)
    rng = np.random.default_rng(0)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    fed.run_round(xs, DIM)  # round 0
    r1 = fed.run_round(xs, DIM)  # round 1
    site = fed.sites["site-01"]
    d = fed.config.digest
    old = M.RoundStart(d, 0, 0, DIM, fed.config.site_ids)
    with pytest.raises(ReplayError, match="not newer"):
        site.handle_round_start(old, xs["site-01"])
    # round 1 re-sent with the identical parameters: the identical MaskedInput, nothing new
    start1 = M.RoundStart(d, 0, r1.round_id, DIM, fed.config.site_ids)
    first = next(h.data for h in fed.transcript if h.sender == "site-01" and isinstance(h.message, M.MaskedInput) and h.message.round_id == 1)
    assert site.handle_round_start(start1, xs["site-01"] + 1).to_bytes() == first
    # the same round with a new participant set (or another length) is a replay
    with pytest.raises(ReplayError, match="different participant set"):
        site.handle_round_start(dataclasses.replace(start1, participants=("site-00", "site-01", "site-02")), xs["site-01"])
    with pytest.raises(ReplayError, match="different participant set"):
        site.handle_round_start(dataclasses.replace(start1, vector_len=DIM + 1), np.zeros(DIM + 1, dtype=np.int64))
    # older rounds' later stages are refused too
    with pytest.raises(ReplayError, match="older"):
        site.handle_consistency_request(M.ConsistencyRequest(d, 0, 0, fed.config.site_ids))
    with pytest.raises(ReplayError, match="already revealed"):
        site.handle_consistency_request(M.ConsistencyRequest(d, 0, 1, fed.config.site_ids))
    # a round id beyond the epoch's slots
    with pytest.raises(InvalidMessage, match="not a slot"):
        site.handle_round_start(M.RoundStart(d, 0, 99, DIM, fed.config.site_ids), xs["site-01"])


def test_retried_round_takes_a_new_slot():
    fed = make_federation(4, 3)
    fed.run_epoch(3)
    rng = np.random.default_rng(1)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    with pytest.raises(Exception):
        fed.run_round(xs, DIM, drop_before_input=["site-00", "site-01"])  # < t: aborts
    res = fed.run_round(xs, DIM)
    assert res.round_id == 1  # round 0 is burnt, never reused
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))


def test_epoch_replays_are_refused():
    fed = make_federation(3, 2)
    fed.run_epoch(2)
    site = fed.sites["site-00"]
    d = fed.config.digest
    ann0 = next(h.message for h in fed.transcript if isinstance(h.message, M.EpochAnnounce))
    # identical re-announcement: the identical advertisement
    adv = next(h.data for h in fed.transcript if h.sender == "site-00" and isinstance(h.message, M.AdvertiseKeys))
    assert site.handle_epoch_announce(ann0).to_bytes() == adv
    with pytest.raises(ReplayError, match="different parameters"):
        site.handle_epoch_announce(dataclasses.replace(ann0, num_rounds=3))
    fed.run_epoch(2)
    with pytest.raises(ReplayError, match="different parameters"):
        site.handle_epoch_announce(M.EpochAnnounce(d, 1, 100, 2))
    with pytest.raises(ReplayError, match="overlapping"):
        site.handle_epoch_announce(M.EpochAnnounce(d, 5, 3, 2))  # rounds 3,4 belong to epoch 1
    with pytest.raises(InvalidMessage, match="allows"):
        site.handle_epoch_announce(M.EpochAnnounce(d, 5, 10, fed.config.max_epoch_rounds + 1))
    roster0 = next(h.message for h in fed.transcript if isinstance(h.message, M.EpochRoster))
    sk0 = next(h.data for h in fed.transcript if h.sender == "site-00" and isinstance(h.message, M.ShareKeys))
    assert site.handle_epoch_roster(roster0).to_bytes() == sk0  # idempotent
    with pytest.raises(ReplayError, match="different roster"):
        site.handle_epoch_roster(dataclasses.replace(roster0, adverts=roster0.adverts[:2]))


def test_wrong_session_digest_refused_everywhere():
    fed = make_federation(3, 2)
    other = make_federation(3, 2, config_kw={"session_id": b"another-session"})
    assert other.config.digest != fed.config.digest
    fed.run_epoch(1)
    other.run_epoch(1)
    for hop in other.transcript:
        msg = hop.message
        if hop.recipient == "<coordinator>":
            continue
        with pytest.raises(InvalidMessage, match="session digest"):
            fed.sites[hop.recipient].handle(msg, np.zeros(DIM, dtype=np.int64))
    setup, _ = fed.coordinator.begin_epoch(1)
    adv = next(h.message for h in other.transcript if isinstance(h.message, M.AdvertiseKeys))
    with pytest.raises(InvalidMessage):
        setup.receive_advertise(adv)
    # a site of a session with another threshold derives another digest too
    assert make_config(3, 3).digest != fed.config.digest


# --------------------------------------------------------------------------- restarts

STOPS = ("after-input", "after-sign", "after-reveal")


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("backend", ["memory", "file"])
def test_site_restart_mid_round(stop, backend, tmp_path):
    storages = {}
    if backend == "file":
        storages = {s: FileStorage(tmp_path / s) for s in make_config(4, 3).site_ids}
    fed = make_federation(4, 3, storages=storages)
    fed.run_epoch(3)
    rng = np.random.default_rng(2)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    victim = "site-02"
    rnd, start = fed.coordinator.begin_round(DIM)
    sent = {}
    for s in start.participants:
        sent[s] = fed.to_site(s, start, xs[s])
        rnd.receive(sent[s])
    if stop == "after-input":
        fed.restart_site(victim)
        assert fed.sites[victim].round_stage(start.round_id) == "input-sent"
        # the coordinator retries RoundStart: identical bytes even with a different input offered
        assert fed.to_site(victim, start, xs[victim] + 7).to_bytes() == sent[victim].to_bytes()
    creq = rnd.close_inputs()
    sigs = {}
    for s in creq.survivors:
        sigs[s] = fed.to_site(s, creq)
        rnd.receive(sigs[s])
    if stop == "after-sign":
        fed.restart_site(victim)
        assert fed.sites[victim].round_stage(start.round_id) == "signed"
        assert fed.to_site(victim, creq).to_bytes() == sigs[victim].to_bytes()
        with pytest.raises(ReplayError):
            fed.to_site(victim, dataclasses.replace(creq, survivors=creq.survivors[:3]))
    ureq = rnd.close_consistency()
    resp = {}
    for s, _ in ureq.signatures:
        resp[s] = fed.to_site(s, ureq)
        rnd.receive(resp[s])
    if stop == "after-reveal":
        fed.restart_site(victim)
        assert fed.sites[victim].round_stage(start.round_id) == "revealed"
        assert fed.to_site(victim, ureq).to_bytes() == resp[victim].to_bytes()
        with pytest.raises(ReplayError):
            fed.to_site(victim, dataclasses.replace(ureq, survivors=ureq.survivors[:3], dropped=ureq.survivors[3:]))
        # a repeated RoundStart of the finished round still only yields the stored input
        assert fed.to_site(victim, start, xs[victim] - 3).to_bytes() == sent[victim].to_bytes()
    res = rnd.finalize()
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    # and the restarted site goes on with the next round normally
    xs2 = random_inputs(fed.config.site_ids, DIM, rng)
    res2 = fed.run_round(xs2, DIM)
    assert np.array_equal(res2.total, plain_sum(xs2, res2.survivors))


def test_finished_round_restart_start_returns_stored_input():
    """After a full round, re-sending its RoundStart gives back the stored input (never a new mask)."""
    fed = make_federation(3, 2)
    fed.run_epoch(3)
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(3))
    rnd, start = fed.coordinator.begin_round(DIM)
    y = fed.sites["site-00"].handle_round_start(start, xs["site-00"])
    fed.restart_site("site-00")
    assert fed.sites["site-00"].handle_round_start(start, None) == y


@pytest.mark.parametrize("backend", ["memory", "file"])
def test_site_restart_mid_epoch(backend, tmp_path):
    storages = {}
    if backend == "file":
        storages = {s: FileStorage(tmp_path / s) for s in make_config(3, 2).site_ids}
    fed = make_federation(3, 2, storages=storages)
    setup, ann = fed.coordinator.begin_epoch(2)
    adv = {s: fed.to_site(s, ann) for s in fed.config.site_ids}
    fed.restart_site("site-01")
    assert fed.to_site("site-01", ann) == adv["site-01"]  # same keys, not fresh ones
    for a in adv.values():
        setup.receive_advertise(a)
    roster = setup.close_advertise()
    sks = {s: fed.to_site(s, roster) for s in roster.senders}
    fed.restart_site("site-01")
    assert fed.sites["site-01"].epoch_stage(0) == "shares-sent"
    assert fed.to_site("site-01", roster) == sks["site-01"]  # same sharing, not a second polynomial
    for sk in sks.values():
        setup.receive_share_keys(sk)
    routed = setup.close_share_keys()
    for s, m in routed.items():
        fed.to_site(s, m)
    fed.restart_site("site-01")
    assert fed.sites["site-01"].epoch_stage(0) == "ready"
    fed.to_site("site-01", routed["site-01"])  # idempotent
    xs = random_inputs(fed.config.site_ids, DIM, np.random.default_rng(4))
    res = fed.run_round(xs, DIM)
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))


def test_watermark_survives_restart_and_old_material_is_deleted():
    storage = MemoryStorage()
    fed = make_federation(3, 2, storages={"site-00": storage})
    rng = np.random.default_rng(5)
    fed.run_epoch(1)
    fed.run_epoch(1)
    fed.run_round(random_inputs(fed.config.site_ids, DIM, rng), DIM)
    fed.run_round(random_inputs(fed.config.site_ids, DIM, rng), DIM)
    site = fed.restart_site("site-00")
    assert site.watermark.max_round == 1 and site.watermark.max_epoch == 1
    assert storage.keys("epoch/") == [k for k in storage.keys("epoch/") if "/00000000000000000001/" in k]
    assert storage.keys("round/") == [f"round/{1:020d}/{p}" for p in ("input", "revealed", "signed")]
    d = fed.config.digest
    with pytest.raises(ReplayError, match="not newer"):
        site.handle_epoch_announce(M.EpochAnnounce(d, 0, 0, 1))
    with pytest.raises(ReplayError):
        site.handle_round_start(M.RoundStart(d, 0, 0, DIM, fed.config.site_ids), np.zeros(DIM, dtype=np.int64))


def test_corrupt_storage_is_reported():
    storage = MemoryStorage()
    fed = make_federation(3, 2, storages={"site-00": storage})
    fed.run_epoch(1)
    key = storage.keys("epoch/")[0]
    storage.put(key, storage.get(key)[:-3])
    with pytest.raises(StorageError, match="corrupt"):
        fed.restart_site("site-00")
    with pytest.raises(StorageError, match="invalid storage key"):
        storage.put("Bad Key", b"")


def test_coordinator_restart_never_reuses_ids_and_resumes_ready_epoch(tmp_path):
    cstore = FileStorage(tmp_path / "coordinator")
    fed = make_federation(3, 2, coordinator_storage=cstore)
    fed.run_epoch(3)
    rng = np.random.default_rng(6)
    xs = random_inputs(fed.config.site_ids, DIM, rng)
    fed.run_round(xs, DIM)
    fed.coordinator.begin_round(DIM)  # round 1 handed out, then the coordinator crashes
    fed.coordinator = SecAggCoordinator(fed.config, cstore)
    assert fed.coordinator.ready_epochs() == [0]
    assert fed.coordinator.slots_remaining() == 1
    res = fed.run_round(xs, DIM)
    assert res.round_id == 2
    assert np.array_equal(res.total, plain_sum(xs, res.survivors))
    _, ann = fed.coordinator.begin_epoch(2)
    assert (ann.epoch, ann.first_round) == (1, 3)
