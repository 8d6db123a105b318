"""murmur2 must match Kafka's Java client bit for bit, or counters would move partitions between clients."""

import pytest

from producers.partitioner import murmur2, partition_for

# Vectors from Apache Kafka's UtilsTest.testMurmur2.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize("data, expected", KAFKA_VECTORS.items())
def test_murmur2_matches_kafka(data, expected):
    assert murmur2(data) == expected


def test_partition_is_positive_modulo():
    for key, h in KAFKA_VECTORS.items():
        for n in (1, 3, 8, 100):
            assert partition_for(key, n) == (h & 0x7FFFFFFF) % n
