"""Admission's refusals read as times and spans a person understands (a walkthrough found
'event_time 1728139680000000 is 67583448.461s before ...' in the DLQ and the 422)."""

from __future__ import annotations

from control_plane import default_config_path, load_namespaces
from control_plane.admission import admission_error
from schemas.validation import iso_micros, micros_iso

NS = load_namespaces(default_config_path())["my_dataset"]  # accept_limit 5 s, max_clock_skew 1 s
ARRIVED = 1_795_723_590_849_211  # 2026-11-26T20:06:30.849211Z


def test_micros_iso_is_the_inverse_of_iso_micros() -> None:
    for us in (0, 1, ARRIVED, 1_728_139_680_000_000, 253_402_300_799_999_999):
        assert iso_micros(micros_iso(us)) == us
    assert micros_iso(ARRIVED) == "2026-11-26T20:06:30.849211Z"


def test_a_late_event_is_named_by_its_time_and_how_late_in_days() -> None:
    reason = admission_error(1_728_139_680_000_000, ARRIVED, NS)
    assert reason == ("event_time 2024-10-05T14:48:00.000000Z is 67583910.849s (782.2 days) before the record "
                      "reached Kafka (2026-11-26T20:06:30.849211Z); namespace 'my_dataset' accepts at most "
                      "accept_limit=5.0s")


def test_an_early_event_and_a_short_gap() -> None:
    assert admission_error(ARRIVED + 2_000_000, ARRIVED, NS) == (
        "event_time 2026-11-26T20:06:32.849211Z is 2.000s after the record reached Kafka "
        "(2026-11-26T20:06:30.849211Z); namespace 'my_dataset' allows max_clock_skew=1.0s")
    assert "(2.0 h)" in admission_error(ARRIVED - 7_200_000_000, ARRIVED, NS)


def test_a_time_no_calendar_holds_is_shown_as_it_came() -> None:
    assert admission_error(10**25, ARRIVED, NS).startswith("event_time 10000000000000000000000000 (epoch µs) is ")
