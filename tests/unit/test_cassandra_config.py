"""cassandra:// URL parsing and the retention/TTL arithmetic."""

from __future__ import annotations

import pytest

from sinks.cassandra.config import (
    EXPIRY_MARGIN_S,
    MAX_EXPIRY_S,
    MAX_TTL_SECONDS,
    CassandraConfig,
    CassandraUrlError,
    ExpiryCap,
    ExpiryOverflow,
    capped_ttl,
    event_ttl_seconds,
    index_ttl_seconds,
    parse_cassandra_url,
    with_replication,
)


def test_the_issue_example_and_defaults():
    c = parse_cassandra_url("cassandra://host1,host2:9042/keyspace?dc=dc1")
    assert c.hosts == ("host1", "host2") and c.port == 9042 and c.keyspace == "keyspace"
    assert c.local_dc == "dc1" and c.consistency == "LOCAL_QUORUM" and c.serial_consistency == "LOCAL_SERIAL"
    assert (c.username, c.password, c.tls, c.create, c.table_ids) == (None, None, False, False, True)
    assert c.concurrency == 128 and c.pending_shards == 16 and c.ttl_grace_s == 86_400
    assert c.replication_map() == {"class": "NetworkTopologyStrategy", "dc1": 3}


def test_every_option():
    c = parse_cassandra_url(
        "cassandra://us%40er:p%3Ass@a:9142,b/ks_1?dc=eu-west_1&consistency=quorum&serial_consistency=SERIAL"
        "&replication=dc1:3,dc2:5&tls=1&ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&tls_verify=0&concurrency=7"
        "&fetch_size=100&timeout=2.5&connect_timeout=3&schema_wait=40&pending_shards=64&ttl_grace=0"
        "&table_ids=no&create=yes&protocol=4")
    assert c.username == "us@er" and c.password == "p:ss"
    assert c.hosts == ("a", "b") and c.port == 9142 and c.keyspace == "ks_1" and c.local_dc == "eu-west_1"
    assert c.consistency == "QUORUM" and c.serial_consistency == "SERIAL"
    assert c.replication == (("dc1", 3), ("dc2", 5))
    assert c.replication_map() == {"class": "NetworkTopologyStrategy", "dc1": 3, "dc2": 5}
    assert (c.tls, c.ca_file, c.cert_file, c.key_file, c.tls_verify) == (True, "/etc/ca.pem", "/c.pem", "/k.pem", False)
    assert (c.concurrency, c.fetch_size, c.timeout_s, c.connect_timeout_s, c.schema_wait_s) == (7, 100, 2.5, 3, 40)
    assert (c.pending_shards, c.ttl_grace_s, c.table_ids, c.create, c.protocol_version) == (64, 0, False, True, 4)


def test_hosts_ports_and_ipv6():
    assert parse_cassandra_url("cassandra://h/ks").port == 9042
    assert parse_cassandra_url("cassandra://h1:9000,h2:9000/ks").port == 9000
    c = parse_cassandra_url("cassandra://[::1]:9043,[fe80::2]/ks")
    assert c.hosts == ("::1", "fe80::2") and c.port == 9043


def test_replication_without_dc_is_simple_strategy():
    assert parse_cassandra_url("cassandra://h/ks?replication=1").replication_map() == {
        "class": "SimpleStrategy", "replication_factor": 1}
    c = with_replication(parse_cassandra_url("cassandra://h/ks?dc=x"), "dc1:2,dc2:2")
    assert c.replication_map() == {"class": "NetworkTopologyStrategy", "dc1": 2, "dc2": 2}
    assert with_replication(c, "5").replication_map() == {"class": "NetworkTopologyStrategy", "x": 5}


def test_password_never_shows():
    c = parse_cassandra_url("cassandra://admin:hunter2@h/ks")
    assert "hunter2" not in repr(c) and "hunter2" not in c.redacted()
    assert c.redacted() == "cassandra://admin:***@h:9042/ks"
    with pytest.raises(CassandraUrlError) as info:
        parse_cassandra_url("postgres://admin:hunter2@h/ks")
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url, names", [
    ("cassandra://h", "no keyspace"),
    ("cassandra://h/", "no keyspace"),
    ("cassandra:///ks", "no host"),
    ("cassandra://h/1ks", "bad keyspace '1ks'"),
    ("cassandra://h/ks/extra", "bad keyspace"),
    ("cassandra://h/" + "k" * 49, "bad keyspace"),
    ("cassandra://h:x/ks", "bad port 'x' in host 'h:x'"),
    ("cassandra://h:70000/ks", "bad port '70000'"),
    ("cassandra://h:/ks", "bad port ''"),
    ("cassandra://a:1,b:2/ks", "different ports [1, 2]"),
    ("cassandra://a,,b/ks", "empty host"),
    ("cassandra://h/ks?dc=", "bad dc=''"),
    ("cassandra://h/ks?consistency=MOST", "bad consistency='MOST'"),
    ("cassandra://h/ks?serial_consistency=QUORUM", "bad serial_consistency='QUORUM'"),
    ("cassandra://h/ks?replication=0", "bad replication='0'"),
    ("cassandra://h/ks?replication=dc1:3,dc1:3", "named twice"),
    ("cassandra://h/ks?replication=dc1=3", "part 'dc1=3'"),
    ("cassandra://h/ks?tls=maybe", "bad tls='maybe'"),
    ("cassandra://h/ks?concurrency=0", "bad concurrency='0'"),
    ("cassandra://h/ks?timeout=-1", "bad timeout='-1'"),
    ("cassandra://h/ks?timeout=soon", "bad timeout='soon'"),
    ("cassandra://h/ks?pending_shards=1e3", "bad pending_shards"),
    ("cassandra://h/ks?protocol=2", "bad protocol='2'"),
    ("cassandra://h/ks?colour=red", "unknown cassandra URL option 'colour'"),
    ("cassandra://h/ks?dc=a&dc=b", "option 'dc' given twice"),
    ("cassandra://h/ks?ca=/x", "not tls=1"),
    ("cassandra://h/ks?tls=1&cert=/c", "'cert' and 'key' go together"),
    ("cassandra://:pw@h/ks", "credentials without a user name"),
    ("cassandra://h/ks#frag", "unexpected fragment"),
    ("sqlite:///x", "expected 'cassandra://"),
])
def test_errors_name_the_bad_part(url, names):
    with pytest.raises(CassandraUrlError) as info:
        parse_cassandra_url(url)
    assert names in str(info.value)


def test_config_is_a_plain_value():
    assert CassandraConfig(hosts=("h",), keyspace="ks") == parse_cassandra_url("cassandra://h/ks")


# -- retention / TTL arithmetic ------------------------------------------------------------------------


def test_table_ttl_is_delete_after_plus_a_slice_plus_grace():
    day = 86_400
    assert event_ttl_seconds(7 * day, day, day) == 9 * day
    assert event_ttl_seconds(3600.2, 60, 0) == 3661  # fractional seconds round up, never expire early
    assert event_ttl_seconds(3600, 60, -5) == 3660  # a negative grace counts as none


def test_no_retention_means_no_ttl():
    assert event_ttl_seconds(None, 86_400, 86_400) == 0
    assert event_ttl_seconds(0, 86_400, 86_400) == 0


def test_ttl_is_capped_at_cassandras_maximum():
    assert event_ttl_seconds(100 * 365 * 86_400, 86_400, 0) == MAX_TTL_SECONDS == 630_720_000


def test_a_row_never_expires_before_its_slice_could_be_dropped():
    """Retention may drop a slice once its end is delete_after old; a row written at w >= event_time
    expires at w + ttl >= slice_end + delete_after + grace: after the drop point, by the grace."""
    seconds_per_slice, delete_after, grace = 3600, 7200, 600
    ttl = event_ttl_seconds(delete_after, seconds_per_slice, grace)
    for event_time in (0, 1, 1799, 3599):  # anywhere in slice [0, 3600)
        slice_end = (event_time // seconds_per_slice + 1) * seconds_per_slice
        assert event_time + ttl >= slice_end + delete_after + grace


def test_index_rows_outlive_their_events():
    assert index_ttl_seconds(0) == 0
    assert index_ttl_seconds(1000) == 1000 + 3600
    assert index_ttl_seconds(MAX_TTL_SECONDS) == MAX_TTL_SECONDS



# -- the 2038 expiry limit (CASSANDRA-14092) ---------------------------------------------------------------

JAN_2030 = 1_893_456_000


def test_ttls_are_capped_so_writes_expire_before_2038():
    limit = MAX_EXPIRY_S - EXPIRY_MARGIN_S
    assert MAX_EXPIRY_S == 2_147_483_646  # 2038-01-19T03:14:06Z
    assert capped_ttl(3600, JAN_2030) == 3600  # short TTLs untouched
    assert capped_ttl(0, JAN_2030) == 0  # no TTL never expires, so never overflows
    assert JAN_2030 + capped_ttl(MAX_TTL_SECONDS, JAN_2030) == limit
    assert JAN_2030 + capped_ttl(15 * 365 * 86_400, JAN_2030 + 0.5) <= limit  # a fractional now rounds up
    with pytest.raises(ExpiryOverflow):
        capped_ttl(3600, limit)


def test_a_cut_retention_is_warned_about_once_per_subject(caplog):
    cap = ExpiryCap(lambda: JAN_2030)
    with caplog.at_level("WARNING", logger="sinks.cassandra.config"):
        assert cap(MAX_TTL_SECONDS, "namespace 'a' events") < MAX_TTL_SECONDS
        cap(MAX_TTL_SECONDS, "namespace 'a' events")
        cap(MAX_TTL_SECONDS, "namespace 'b' events")
        cap(MAX_TTL_SECONDS)  # no subject: quiet
        cap(3600, "namespace 'c' events")  # not cut
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["namespace 'a' events", "namespace 'b' events"]


# -- consistency: valid for reads, and reads meet writes -----------------------------------------------------

@pytest.mark.parametrize("query, names", [
    ("consistency=ANY", "bad consistency='ANY': it is valid for writes only"),
    ("consistency=ANY&unsafe_consistency=1", "bad consistency='ANY'"),  # no opt-in makes ANY readable
    ("consistency=ONE", "bad consistency='ONE': with replication factor 3"),
    ("consistency=LOCAL_ONE&dc=dc1", "bad consistency='LOCAL_ONE': with replication factor 3"),
    ("consistency=LOCAL_ONE&dc=dc1&replication=dc1:2,dc2:1", "replication factor 2"),
    ("consistency=ONE&replication=dc1:1,dc2:1", "replication factor 2"),  # ONE may read the other DC
    ("consistency=TWO&replication=4", "bad consistency='TWO': with replication factor 4"),
    ("consistency=THREE&replication=2", "bad consistency='THREE': it waits for 3 replicas but replication gives 2"),
])
def test_consistency_levels_that_break_the_stores_are_refused(query, names):
    with pytest.raises(CassandraUrlError) as info:
        parse_cassandra_url(f"cassandra://h/ks?{query}")
    assert names in str(info.value) and "consistency" in str(info.value)


@pytest.mark.parametrize("query", [
    "", "consistency=QUORUM", "consistency=EACH_QUORUM&replication=dc1:3,dc2:3", "consistency=ALL",
    "consistency=ONE&replication=1",  # one replica: every read meets every write
    "consistency=TWO",  # 2 + 2 > 3
    "consistency=LOCAL_ONE&dc=dc1&replication=dc1:1,dc2:3",
    "consistency=ONE&unsafe_consistency=1",  # explicitly accepted
])
def test_consistency_levels_whose_reads_meet_writes_are_accepted(query):
    config = parse_cassandra_url(f"cassandra://h/ks?{query}")
    assert config.unsafe_consistency == ("unsafe_consistency=1" in query)


def test_changing_the_replication_rechecks_the_consistency():
    config = parse_cassandra_url("cassandra://h/ks?consistency=ONE&replication=1")
    with pytest.raises(CassandraUrlError, match="bad consistency='ONE'"):
        with_replication(config, "3")
