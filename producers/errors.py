"""What a Kafka producer of the service raises when the broker did not take a record: shared by the client library
(`CounterProducer`), the asyncio producer of the worker and the API, and the API's group commit."""

from __future__ import annotations

from collections.abc import Iterable

from schemas import Mutation

__all__ = ["DeliveryError"]


class DeliveryError(RuntimeError):
    """Mutations the broker did not acknowledge. `failures` holds (record key, reason) pairs; `mutations` the
    failed mutations as they were sent (tokens and event times included), for `CounterProducer.retry`: re-sent
    unchanged, a mutation the broker did store after all is still counted once. Empty when the failure is not
    about given mutations (e.g. records still unacknowledged when `flush` gave up: their futures will say)."""

    def __init__(self, message: str, failures: list[tuple[str, str]] | None = None,
                 mutations: Iterable[Mutation] = (), refusals: list[tuple[Mutation, str]] | None = None) -> None:
        super().__init__(message)
        self.failures = failures or []
        self.mutations = list(mutations)
        self.refusals = refusals or []  # acknowledged meanwhile and refused by admission (`NotAdmitted`): not to retry
