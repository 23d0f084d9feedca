"""The key strings are a contract with the Lua scripts and with the data already in Redis:
every builder of `Keys`, on one server and in the cluster layout, still gives for a sample
of ids the strings recorded in key_strings.json (written before the layout moved out of
keys.py)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from groupbuy.storage.keys import Keys

RECORDED = Path(__file__).with_name("key_strings.json")
ACTIVITIES = ["a1", "act-42", "x{y}", ""]
PACKETS = ["p1", "pk-9", "ü"]
SENDERS = ["s1", "sender 7"]
CLUSTER_SLOTS = [0, 1, 5461, 16383]


def activity_strings(keys: Keys, a: str) -> dict[str, Any]:
    slot = keys.activity_slot(a)
    return {
        f"activity_slot {a}": slot,
        f"activity {a}": keys.activity(a),
        f"outbox {a}": keys.outbox(a),
        f"team_key_prefix {a}": keys.team_key_prefix(a),
        f"team {a}": keys.team(a, "t9"),
        f"user_lock {a}": keys.user_lock(a, "u1"),
        f"user_counter {a}": keys.user_counter(a, "u1", "led"),
        f"team_restoring {a}": keys.team_restoring(a, "t9"),
        f"lock_index {a}": keys.lock_index(a),
        f"deadline_index {a}": keys.deadline_index(a),
        f"open_seats {a}": keys.open_seats(a),
        f"activity_blocklist {a}": keys.activity_blocklist(a),
        f"activity_keys {a}": asdict(keys.activity_keys(a)),
        f"team_keys {a}": asdict(keys.team_keys(a, "t9")),
        f"indexes {a}": [
            *keys.global_indexes(slot),
            keys.dead_letters(slot),
            keys.blocked_users(slot),
        ],
    }


def packet_strings(keys: Keys, p: str) -> dict[str, Any]:
    outbox_slot = keys.slot_of(keys.packet_outbox(p))
    return {
        f"packet_slot {p}": keys.packet_slot(p),
        f"packet_keys {p}": asdict(keys.packet_keys(p)),
        f"packet_restoring {p}": keys.packet_restoring(p),
        f"packet_outbox {p}": keys.packet_outbox(p),
        f"slot_of outbox {p}": outbox_slot,
        f"dead_letters {p}": keys.dead_letters(outbox_slot),
    }


def sender_strings(keys: Keys, s: str) -> dict[str, Any]:
    slot = keys.sender_slot(s)
    return {
        f"sender_slot {s}": slot,
        f"sender_day {s}": keys.sender_day(s, 20000),
        f"sender blocklist {s}": keys.blocked_users(slot),
    }


def built(keys: Keys) -> dict[str, Any]:
    """Every key string `keys` builds for the sample ids."""
    strings: dict[str, Any] = {}
    for a in ACTIVITIES:
        strings |= activity_strings(keys, a)
    for p in PACKETS:
        strings |= packet_strings(keys, p)
    for s in SENDERS:
        strings |= sender_strings(keys, s)
    for slot in CLUSTER_SLOTS if keys.cluster else [None]:
        strings[f"global_indexes {slot}"] = keys.global_indexes(slot)
        strings[f"dead_letters {slot}"] = keys.dead_letters(slot)
        strings[f"blocked_users {slot}"] = keys.blocked_users(slot)
    strings["blocked_users"] = keys.blocked_users()
    strings["slot_directory"] = keys.slot_directory()
    strings["seen_signature"] = keys.seen_signature("abc")
    strings["lease"] = keys.lease("jobs")
    strings["rate_buckets"] = [
        *keys.rate_buckets("k1", "grab", "u1"),
        *keys.rate_buckets("k1", "grab", None),
        *keys.rate_buckets("k1", "grab", "u2", by_key=False),
    ]
    strings["suffixes"] = [keys.members_suffix, keys.locks_suffix]
    return strings


def test_every_key_string_is_the_one_recorded() -> None:
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    now = {
        f"{prefix} cluster={cluster}": built(Keys(prefix, cluster=cluster))
        for prefix in ("gb", "t")
        for cluster in (False, True)
    }
    assert now.keys() == recorded.keys()
    for layout, strings in now.items():
        assert strings == recorded[layout], layout
