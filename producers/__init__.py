"""Client library that produces count mutations to Kafka (`CounterProducer`); the asyncio Kafka producer of the worker
and the API (`asyncio_producer`, `handle`) and the API's group commit (`group_commit`). `counter produce` is
`counter_cli.produce_cmd`."""

from producers.client import CounterProducer, NotAdmitted, new_token
from producers.errors import DeliveryError
from producers.partitioner import murmur2, partition_for

__all__ = ["CounterProducer", "DeliveryError", "NotAdmitted", "murmur2", "new_token", "partition_for"]
