"""``cassandra://`` store URLs and the retention arithmetic of the Cassandra backend (pure, no driver).

URL format (every query parameter is optional)::

    cassandra://[user[:password]@]host1[:port],host2[:port]/keyspace?dc=dc1&consistency=LOCAL_QUORUM
        &replication=3 | replication=dc1:3,dc2:3      keyspace replication used by `counter schema apply`
        &serial_consistency=LOCAL_SERIAL             for the lightweight transactions (namespace pin, claims)
        &tls=1&ca=/ca.pem&cert=/client.pem&key=/client.key&tls_verify=1
        &concurrency=128                             requests in flight per process
        &fetch_size=5000&timeout=10&connect_timeout=10&schema_wait=30
        &pending_shards=16                           partitions of the pending-rollup marker table (raise only;
                                                     the same in every process: infra/README.md)
        &ttl_grace=86400                             seconds added to delete_after for the table TTL
        &unsafe_consistency=1                        accept a consistency whose reads may miss writes (see below)
        &table_ids=1                                 deterministic table ids for slice tables
        &create=0                                    create keyspace and tables on open (tests, dev)
        &protocol=5                                  native protocol version (default: negotiated)

A port may be written on any host; all hosts share one port (default 9042). User and password
are percent-decoded; the password never appears in ``repr`` or :meth:`CassandraConfig.redacted`.

``consistency`` applies to reads and writes alike, and the stores read their own writes (the event
store looks stored identities up before inserting, the rollup and bucket stores read a write back to
learn whether it applied). So the level must be valid for reads (not ANY), and a read must meet the
replicas a write reached: ``2 x replicas(level) > replication factor`` (ONE or LOCAL_ONE with RF 3,
TWO with RF 4 break that; QUORUM-type levels never do). Such a level is refused unless
``unsafe_consistency=1`` says to accept it: a re-sent event the read misses is then inserted again and
reported new (a replay recounts for nothing; a re-used token with another delta may replace the first),
and a rollup or bucket write may be reported not applied, or applied when it was overtaken (a wasted
re-signal or a stale cache entry). The replication factor checked is the URL's ``replication``
(default 3), which should match the keyspace's.

TTLs: Cassandra < 5.0, and 5.0 in its default ``storage_compatibility_mode: CASSANDRA_4``, cannot
store an expiry after 2038-01-19T03:14:06Z and by default rejects such writes (CASSANDRA-14092). Every
TTL the stores send is capped at write time (:class:`ExpiryCap`) so the expiry stays a margin
before that date; a retention longer than what is left until then is cut, with one warning.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote

__all__ = [
    "CONSISTENCY_LEVELS",
    "DEFAULT_PORT",
    "MAX_TTL_SECONDS",
    "CassandraConfig",
    "CassandraUrlError",
    "ExpiryCap",
    "ExpiryOverflow",
    "bucket_ttl_seconds",
    "capped_ttl",
    "event_ttl_seconds",
    "index_ttl_seconds",
    "parse_cassandra_url",
    "with_replication",
]

log = logging.getLogger(__name__)

DEFAULT_PORT = 9042
MAX_TTL_SECONDS = 630_720_000  # Cassandra's cap: 20 years
# The latest expiry (epoch seconds, 2038-01-19T03:14:06Z) Cassandra < 5.0 and 5.0 in storage_compatibility_mode
# CASSANDRA_4 can store: a write expiring later is rejected (CASSANDRA-14092, default policy REJECT).
MAX_EXPIRY_S = 2_147_483_646
# TTLs keep expiries this far before MAX_EXPIRY_S: the coordinator adds the TTL to *its* clock, maybe later
# than ours, and a retried or hinted write may be applied later still.
EXPIRY_MARGIN_S = 86_400
INDEX_TTL_MARGIN_S = 3600  # bucket-index rows outlive the events they point at

CONSISTENCY_LEVELS = (
    "ANY", "ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE",
)
# Replicas a request at a counting level waits for, and whether they are counted in the local DC only;
# the other levels (QUORUM, LOCAL_QUORUM, EACH_QUORUM, ALL) make any read meet any write by construction, within
# one DC for LOCAL_QUORUM (workers of one consumer group keep to one DC with it: infra/README.md, Scaling).
_COUNTED_LEVELS = {"ONE": (1, False), "TWO": (2, False), "THREE": (3, False), "LOCAL_ONE": (1, True)}
SERIAL_LEVELS = ("SERIAL", "LOCAL_SERIAL")

_IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
_DC = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class CassandraUrlError(ValueError):
    """A ``cassandra://`` URL that cannot be used; the message names the offending part."""


@dataclass(frozen=True, slots=True)
class CassandraConfig:
    hosts: tuple[str, ...]
    keyspace: str
    port: int = DEFAULT_PORT
    local_dc: str | None = None
    consistency: str = "LOCAL_QUORUM"
    serial_consistency: str = "LOCAL_SERIAL"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    tls_verify: bool = True
    replication: tuple[tuple[str, int], ...] = ()  # (dc, rf) pairs; empty = use replication_factor
    replication_factor: int = 3
    concurrency: int = 128
    fetch_size: int = 5000
    timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    schema_wait_s: float = 30.0
    pending_shards: int = 16
    ttl_grace_s: int = 86_400
    table_ids: bool = True
    create: bool = False
    protocol_version: int | None = None
    unsafe_consistency: bool = False  # accept a consistency whose reads may miss the preceding writes

    def redacted(self) -> str:
        """The URL without the password, for logs and error messages."""
        user = f"{self.username}:***@" if self.username and self.password else (
            f"{self.username}@" if self.username else "")
        return f"cassandra://{user}{','.join(self.hosts)}:{self.port}/{self.keyspace}"

    def replication_map(self) -> dict[str, int | str]:
        """The keyspace's replication option: NetworkTopologyStrategy when a DC is known, else
        SimpleStrategy (a single-DC dev cluster)."""
        if self.replication:
            return {"class": "NetworkTopologyStrategy", **dict(self.replication)}
        if self.local_dc:
            return {"class": "NetworkTopologyStrategy", self.local_dc: self.replication_factor}
        return {"class": "SimpleStrategy", "replication_factor": self.replication_factor}


def parse_cassandra_url(url: str) -> CassandraConfig:
    """Parse a ``cassandra://`` store URL (see the module docstring); errors name the bad part."""
    text = url.strip()
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() != "cassandra":
        raise CassandraUrlError("expected 'cassandra://host[,host][:port]/keyspace[?options]', "
                                f"got {masked_url(text)!r}")
    rest, _, fragment = rest.partition("#")
    if fragment:
        raise CassandraUrlError(f"unexpected fragment '#{fragment}' in cassandra URL")
    location, _, query = rest.partition("?")
    netloc, slash, path = location.partition("/")
    if not slash or not path.strip("/"):
        raise CassandraUrlError("cassandra URL names no keyspace: expected cassandra://hosts/keyspace")
    keyspace = path.strip("/")
    if "/" in keyspace or not _IDENT.match(keyspace):
        raise CassandraUrlError(f"bad keyspace {keyspace!r}: a letter then up to 47 letters, digits or '_'")
    keyspace = keyspace.lower()  # as CQL folds an unquoted name: the schema check looks it up by the folded name

    username = password = None
    userinfo, at, hostpart = netloc.rpartition("@")
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
        if username is None:
            raise CassandraUrlError("cassandra URL has credentials without a user name")
    hosts, port = _parse_hosts(hostpart)

    options: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        if key in options:
            raise CassandraUrlError(f"option {key!r} given twice in cassandra URL")
        options[key] = value
    kw: dict[str, Any] = {}  # field name -> value of that field's type (the option parsers check them)
    for key, value in options.items():
        parser = _OPTIONS.get(key)
        if parser is None:
            raise CassandraUrlError(f"unknown cassandra URL option {key!r} (known: {', '.join(sorted(_OPTIONS))})")
        parser(key, value, kw)
    config = CassandraConfig(hosts=hosts, keyspace=keyspace, port=port, username=username, password=password,
                             **kw)
    if (config.cert_file is None) != (config.key_file is None):
        raise CassandraUrlError("cassandra URL options 'cert' and 'key' go together (client certificate)")
    if (config.ca_file or config.cert_file) and not config.tls:
        raise CassandraUrlError("cassandra URL gives 'ca'/'cert' but not tls=1")
    check_consistency(config)
    return config


def with_replication(config: CassandraConfig, text: str) -> CassandraConfig:
    """``config`` with the replication given as ``N`` or ``dc1:N,dc2:M`` (as the URL option)."""
    kw: dict[str, Any] = {}  # field name -> value of that field's type (the option parsers check them)
    _replication("replication", text, kw)
    changed = replace(config, replication=kw.get("replication", ()),
                      replication_factor=int(kw.get("replication_factor", config.replication_factor)))
    check_consistency(changed)
    return changed


def check_consistency(config: CassandraConfig) -> None:
    """Refuse a ``consistency`` the stores cannot work with (see the module docstring); the message names
    the option. Reads and writes share the level, so ANY (write-only) is refused outright."""
    level = config.consistency
    if level == "ANY":
        raise CassandraUrlError("bad consistency='ANY': it is valid for writes only, and the stores read with "
                                "the same level (use LOCAL_QUORUM, the default, or QUORUM)")
    counted = _COUNTED_LEVELS.get(level)
    if counted is None:
        return
    replicas, local = counted
    rf = _local_rf(config) if local else _total_rf(config)
    if replicas > rf:
        raise CassandraUrlError(f"bad consistency={level!r}: it waits for {replicas} replicas but replication "
                                f"gives {rf}, so every request would fail as unavailable")
    if 2 * replicas <= rf and not config.unsafe_consistency:
        raise CassandraUrlError(
            f"bad consistency={level!r}: with replication factor {rf} a read ({replicas} replica(s)) may miss "
            f"the write it follows ({replicas} replica(s)), and the stores read their own writes (stored events, "
            f"rollup and bucket read-backs); use LOCAL_QUORUM (the default) or QUORUM, or add "
            f"unsafe_consistency=1 to accept that risk")


def _total_rf(config: CassandraConfig) -> int:
    return sum(rf for _dc, rf in config.replication) if config.replication else config.replication_factor


def _local_rf(config: CassandraConfig) -> int:
    """The local DC's replication factor; the largest of any DC when the URL does not say which is local."""
    if not config.replication:
        return config.replication_factor
    per_dc = dict(config.replication)
    return per_dc.get(config.local_dc or "", max(per_dc.values()))


def masked_url(text: str) -> str:
    """The URL with any password masked (for error messages, and wherever a store URL is shown or recorded)."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", text)


def _parse_hosts(hostpart: str) -> tuple[tuple[str, ...], int]:
    if not hostpart:
        raise CassandraUrlError("cassandra URL names no host: expected cassandra://host1,host2:9042/keyspace")
    hosts: list[str] = []
    ports: set[int] = set()
    for raw in hostpart.split(","):
        item = raw.strip()
        if not item:
            raise CassandraUrlError(f"empty host in {hostpart!r}")
        if item.startswith("["):  # [ipv6]:port
            end = item.find("]")
            if end < 0:
                raise CassandraUrlError(f"bad host {item!r}: unclosed '['")
            host, tail = item[1:end], item[end + 1:]
            if tail and not tail.startswith(":"):
                raise CassandraUrlError(f"bad host {item!r}")
            port_text = tail[1:] if tail else ""
        else:
            host, colon, port_text = item.partition(":")
            if colon and not port_text:
                raise CassandraUrlError(f"bad port '' in host {item!r}")
        if not host or not re.match(r"^[A-Za-z0-9_.\-:%]+$", host):
            raise CassandraUrlError(f"bad host name {host!r} in {hostpart!r}")
        if port_text:
            if not port_text.isdigit() or not 0 < int(port_text) < 65536:
                raise CassandraUrlError(f"bad port {port_text!r} in host {item!r}")
            ports.add(int(port_text))
        hosts.append(host)
    if len(ports) > 1:
        raise CassandraUrlError(f"hosts use different ports {sorted(ports)}: all hosts share one port")
    return tuple(hosts), (ports.pop() if ports else DEFAULT_PORT)


# -- option parsers: each validates one query parameter and sets CassandraConfig keyword(s) ------

def _level(choices: tuple[str, ...], attr: str):
    def parse(key: str, value: str, kw: dict[str, object]) -> None:
        level = value.strip().upper()
        if level not in choices:
            raise CassandraUrlError(f"bad {key}={value!r}: expected one of {', '.join(choices)}")
        kw[attr] = level
    return parse


def _flag(attr: str):
    def parse(key: str, value: str, kw: dict[str, object]) -> None:
        v = value.strip().lower()
        if v in _TRUE or v == "":
            kw[attr] = True
        elif v in _FALSE:
            kw[attr] = False
        else:
            raise CassandraUrlError(f"bad {key}={value!r}: expected 1/0, true/false, yes/no")
    return parse


def _int(attr: str, lo: int, hi: int):
    def parse(key: str, value: str, kw: dict[str, object]) -> None:
        v = value.strip()
        if not re.fullmatch(r"\d+", v) or not lo <= int(v) <= hi:
            raise CassandraUrlError(f"bad {key}={value!r}: expected an integer in [{lo}, {hi}]")
        kw[attr] = int(v)
    return parse


def _seconds(attr: str, hi: float):
    def parse(key: str, value: str, kw: dict[str, object]) -> None:
        try:
            v = float(value)
        except ValueError:
            v = math.nan
        if not (0 < v <= hi):
            raise CassandraUrlError(f"bad {key}={value!r}: expected seconds in (0, {hi:g}]")
        kw[attr] = v
    return parse


def _path(attr: str):
    def parse(key: str, value: str, kw: dict[str, object]) -> None:
        if not value.strip():
            raise CassandraUrlError(f"bad {key}=: expected a file path")
        kw[attr] = value.strip()
    return parse


def _dc(key: str, value: str, kw: dict[str, object]) -> None:
    if not _DC.match(value.strip()):
        raise CassandraUrlError(f"bad {key}={value!r}: expected a data center name")
    kw["local_dc"] = value.strip()


def _replication(key: str, value: str, kw: dict[str, object]) -> None:
    """``3`` (replication factor in the local DC) or ``dc1:3,dc2:3`` (per data center)."""
    v = value.strip()
    if re.fullmatch(r"\d+", v):
        if not 1 <= int(v) <= 15:
            raise CassandraUrlError(f"bad {key}={value!r}: replication factor must be in [1, 15]")
        kw["replication_factor"] = int(v)
        return
    pairs: list[tuple[str, int]] = []
    for part in v.split(","):
        dc, colon, rf = part.strip().partition(":")
        if not colon or not _DC.match(dc) or not rf.isdigit() or not 1 <= int(rf) <= 15:
            raise CassandraUrlError(f"bad {key}={value!r}: expected N or dc1:N,dc2:M (part {part.strip()!r})")
        pairs.append((dc, int(rf)))
    if len({dc for dc, _ in pairs}) != len(pairs):
        raise CassandraUrlError(f"bad {key}={value!r}: a data center is named twice")
    kw["replication"] = tuple(pairs)


def _protocol(key: str, value: str, kw: dict[str, object]) -> None:
    _int("protocol_version", 3, 6)(key, value, kw)


_OPTIONS = {
    "dc": _dc,
    "consistency": _level(CONSISTENCY_LEVELS, "consistency"),
    "serial_consistency": _level(SERIAL_LEVELS, "serial_consistency"),
    "replication": _replication,
    "tls": _flag("tls"),
    "ssl": _flag("tls"),
    "ca": _path("ca_file"),
    "cert": _path("cert_file"),
    "key": _path("key_file"),
    "tls_verify": _flag("tls_verify"),
    "concurrency": _int("concurrency", 1, 10_000),
    "fetch_size": _int("fetch_size", 10, 1_000_000),
    "timeout": _seconds("timeout_s", 600),
    "connect_timeout": _seconds("connect_timeout_s", 600),
    "schema_wait": _seconds("schema_wait_s", 600),
    "pending_shards": _int("pending_shards", 1, 4096),
    "ttl_grace": _int("ttl_grace_s", 0, MAX_TTL_SECONDS),
    "table_ids": _flag("table_ids"),
    "create": _flag("create"),
    "protocol": _protocol,
    "unsafe_consistency": _flag("unsafe_consistency"),
}


# -- retention arithmetic ---------------------------------------------------------------------------

def event_ttl_seconds(delete_after_s: float | None, seconds_per_slice: int, grace_s: int) -> int:
    """``default_time_to_live`` of a slice table: a backstop behind ``drop_expired_slices``.

    Retention drops a slice once its end is ``delete_after`` old *and* every counter rolled past it;
    a row written at ``w >= event_time`` expires at ``w + ttl``. With
    ``ttl = delete_after + seconds_per_slice + grace`` a row never expires before its slice was due
    to be dropped plus ``grace``, so the TTL only matters when rollups (and with them retention) are
    stalled for longer than ``grace``: then the backstop wins over "delete only rolled-up events",
    bounding disk use. 0 (no TTL) when ``delete_after`` is unknown; capped at Cassandra's 20 years
    (and at write time by :class:`ExpiryCap`).
    """
    if delete_after_s is None or delete_after_s <= 0:
        return 0
    ttl = math.ceil(delete_after_s) + int(seconds_per_slice) + max(0, int(grace_s))
    return min(ttl, MAX_TTL_SECONDS)


def index_ttl_seconds(event_ttl_s: int) -> int:
    """TTL of bucket-index rows: they must outlive the events they point at (0 = none)."""
    if event_ttl_s <= 0:
        return 0
    return min(event_ttl_s + INDEX_TTL_MARGIN_S, MAX_TTL_SECONDS)


def bucket_ttl_seconds(retention_s: float | None, width_s: int, slice_s: int, grace_s: int) -> int:
    """TTL of a time bucket (and of the catalog rows naming its slice): a backstop behind ``drop_expired``.

    A bucket may be written up to its own width before it ends (an open hour is rewritten by every rollup),
    and retention with a slice-aligned cutoff drops it up to one slice after it expired; so with
    ``ttl = retention + width + slice + grace`` the TTL never fires before retention would have dropped the
    bucket, and only bounds disk use when retention does not run. 0 (no TTL) when the granularity is kept
    forever; capped at Cassandra's 20 years (and at write time by :class:`ExpiryCap`).
    """
    if retention_s is None or retention_s <= 0:
        return 0
    ttl = math.ceil(retention_s) + int(width_s) + int(slice_s) + max(0, int(grace_s))
    return min(ttl, MAX_TTL_SECONDS)


# -- the 2038 expiry limit ----------------------------------------------------------------------------

class ExpiryOverflow(RuntimeError):
    """No TTL can keep an expiry before Cassandra's limit any more: upgrade to Cassandra 5.0 with
    ``storage_compatibility_mode: NONE`` (then drop the cap) rather than write data that expires at once."""


def capped_ttl(ttl_s: int, now_s: float) -> int:
    """``ttl_s`` cut so a write sent at ``now_s`` expires ``EXPIRY_MARGIN_S`` before ``MAX_EXPIRY_S``;
    0 (no TTL: never expires, so never overflows) stays 0."""
    if ttl_s <= 0:
        return 0
    room = MAX_EXPIRY_S - EXPIRY_MARGIN_S - math.ceil(now_s)
    if room < 1:
        raise ExpiryOverflow(f"a TTL written now cannot expire before {MAX_EXPIRY_S} (2038-01-19T03:14:06Z) "
                             f"less {EXPIRY_MARGIN_S}s: this Cassandra storage format cannot hold it")
    return min(int(ttl_s), room)


class ExpiryCap:
    """Caps TTLs as they are bound (:func:`capped_ttl` at the clock's now), and warns once per subject
    (a namespace's events, a granularity's buckets) whose configured retention gets cut, so an operator
    learns that data will expire before 2038 instead of every write failing."""

    def __init__(self, clock_s: Callable[[], float] = time.time) -> None:
        self._clock_s = clock_s
        self._warned: set[str] = set()

    def __call__(self, ttl_s: int, subject: str = "") -> int:
        """``ttl_s`` capped as of now; a cut warns once per non-empty ``subject``."""
        capped = capped_ttl(ttl_s, self._clock_s())
        if capped < ttl_s and subject and subject not in self._warned:
            self._warned.add(subject)
            log.warning("%s: TTL %ds cut to %ds so that rows expire before 2038-01-19 (Cassandra < 5.0, or 5.0 in "
                        "storage_compatibility_mode CASSANDRA_4, rejects later expiries); data is kept %.1f years, "
                        "not as long as configured", subject, ttl_s, capped, capped / (365.25 * 86_400))
        return capped
