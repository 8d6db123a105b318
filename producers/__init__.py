"""Client library that produces count mutations to Kafka (`CounterProducer`) and the `produce` CLI verb."""

from producers.client import CounterProducer, DeliveryError, NotAdmitted, new_token
from producers.partitioner import murmur2, partition_for

__all__ = ["CounterProducer", "DeliveryError", "NotAdmitted", "murmur2", "new_token", "partition_for"]
