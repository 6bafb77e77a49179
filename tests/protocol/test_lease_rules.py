"""The pure decisions of a lease (`sidecar.protocol.leases.LeaseRules`): renewal, validity,
loss, expiry and take-over, with time given as numbers."""

from __future__ import annotations

import json

import pytest

from sidecar.protocol.leases import (
    VALID_FRACTION,
    Acquire,
    LeaseRules,
    LeaseState,
    Look,
    Lost,
    Renew,
    holder_of,
)

TTL = 6.0


def value(holder: str, epoch: int | None = None, **extra: object) -> bytes:
    return json.dumps({**extra, "holder": holder, "epoch": epoch}).encode()


def held(at: float = 0.0, revision: int = 5) -> LeaseRules:
    """Rules of a replica that acquired the free key at `at`, written as `revision`."""
    rules = LeaseRules(TTL)
    assert rules.begin(at) == (None, Look())
    assert rules.absent(acquire=True) == Acquire(None)
    rules.acquired(at, revision, "me")
    return rules


def test_a_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        LeaseRules(0)


def test_a_free_key_is_created_only_when_acquiring() -> None:
    rules = LeaseRules(TTL)
    assert rules.absent(acquire=False) is None
    assert rules.absent(acquire=True) == Acquire(None)


def test_the_holder_leads_until_a_fraction_of_the_ttl_after_it_sent() -> None:
    rules = held(at=10.0, revision=5)
    assert rules.state(10.0) == LeaseState(True, 5, "me", 5)
    until = 10.0 + VALID_FRACTION * TTL
    assert rules.leads(until - 0.001)
    assert not rules.leads(until)
    assert rules.state(until) == LeaseState(False, 0, "me", 0)


def test_a_holder_renews_over_its_last_revision_and_its_validity_counts_from_the_send() -> None:
    rules = held(at=0.0, revision=5)
    assert rules.begin(1.0) == (None, Renew(epoch=5, last=5))
    rules.renewed(sent=1.0, revision=9)
    assert rules.begin(2.0) == (None, Renew(epoch=5, last=9))
    assert rules.leads(1.0 + VALID_FRACTION * TTL - 0.001)
    assert not rules.leads(1.0 + VALID_FRACTION * TTL)
    assert rules.state(2.0).epoch == 5  # the epoch stays the acquisition's revision


def test_an_expired_lease_is_lost_before_the_round_reaches_the_bucket() -> None:
    """A round whose requests all fail still starts with `begin`: a lease whose validity ran
    out meanwhile is reported lost then (the bug the alert test found on real servers)."""
    rules = held(at=0.0, revision=5)
    lost, todo = rules.begin(VALID_FRACTION * TTL)
    assert lost == Lost(5, "expired")
    assert todo == Look()  # no longer a holder: it looks, it does not renew
    assert rules.state(VALID_FRACTION * TTL) == LeaseState(False, 0, None, 0)
    assert rules.begin(VALID_FRACTION * TTL + 1) == (None, Look())  # reported once


def test_a_refused_renewal_is_a_take_over() -> None:
    rules = held(revision=5)
    assert rules.refused() == Lost(5, "taken_over")
    assert not rules.leads(0.1) and rules.state(0.1).holder is None


def test_a_revision_unchanged_for_a_whole_ttl_is_taken_over() -> None:
    rules = LeaseRules(TTL)
    assert rules.observed(100.0, 7, value("other"), acquire=True) is None
    assert rules.state(100.0) == LeaseState(False, 0, "other", 7)
    assert rules.observed(100.0 + TTL - 0.001, 7, value("other"), acquire=True) is None
    assert rules.observed(100.0 + TTL, 7, value("other"), acquire=True) == Acquire(7)


def test_watching_without_acquiring_counts_the_ttl_all_the_same() -> None:
    rules = LeaseRules(TTL)
    assert rules.observed(0.0, 7, value("other"), acquire=False) is None
    assert rules.observed(TTL * 2, 7, value("other"), acquire=False) is None
    # From the first observation, not from the first round that may acquire.
    assert rules.observed(TTL * 2, 7, value("other"), acquire=True) == Acquire(7)


def test_a_new_revision_restarts_the_count() -> None:
    rules = LeaseRules(TTL)
    rules.observed(0.0, 7, value("other"), acquire=True)
    assert rules.observed(TTL - 1, 8, value("other", epoch=7), acquire=True) is None
    assert rules.observed(TTL + 1, 8, value("other", epoch=7), acquire=True) is None
    assert rules.state(TTL + 1).leader_epoch == 7  # the epoch it writes, not the revision
    assert rules.observed(2 * TTL - 1, 8, value("other", epoch=7), acquire=True) == Acquire(8)


def test_a_lost_lease_is_watched_a_whole_ttl_again_before_it_is_taken() -> None:
    rules = LeaseRules(TTL)
    rules.observed(0.0, 7, value("other"), acquire=True)
    rules.acquired(TTL, 9, "me")  # took it over
    assert rules.refused() == Lost(9, "taken_over")
    later = 10 * TTL
    assert rules.observed(later, 9, value("third"), acquire=True) is None
    assert rules.observed(later + TTL, 9, value("third"), acquire=True) == Acquire(9)


def test_a_release_gives_the_revision_to_delete_and_leads_no_more() -> None:
    rules = held(revision=5)
    rules.renewed(1.0, 6)
    assert rules.release() == 6
    assert not rules.leads(1.0) and rules.state(1.0) == LeaseState(False, 0, None, 0)
    assert rules.release() is None
    assert LeaseRules(TTL).release() is None


def test_unreadable_values_name_no_holder() -> None:
    assert holder_of(value("a", 3, shards=4)) == ("a", 3, {"shards": 4})
    assert holder_of(None) == (None, 0, {})
    assert holder_of(b"{not json") == (None, 0, {})
    assert holder_of(b"[1]") == (None, 0, {})
    assert holder_of(b'{"epoch": 3}') == (None, 0, {})
    assert holder_of(b'{"holder": 4, "epoch": true}') == (None, 0, {})
    assert holder_of(b'{"holder": "a", "epoch": -1}') == ("a", 0, {})
    rules = LeaseRules(TTL)
    rules.observed(0.0, 4, b"garbage", acquire=True)
    assert rules.state(0.0) == LeaseState(False, 0, None, 4)
    assert rules.observed(TTL, 4, b"garbage", acquire=True) == Acquire(4)
