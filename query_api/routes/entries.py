"""What the batch routes share: a refusal of one of a batch's entries names it (`requests.N.<field>`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from query_api.service import NamespaceNotFound, Rejected
from sinks.windows import WindowError


@contextmanager
def entry(i: int) -> Iterator[None]:
    """Re-raise a refusal of the batch's entry `i` naming it: a 422's field `requests.i.<field>`, as pydantic names
    the fields of the entries it refuses; a 404's detail `requests.i.namespace: unknown namespace ...`."""
    try:
        yield
    except Rejected as exc:
        raise Rejected(f"requests.{i}.{exc.field}", exc.reason) from None
    except WindowError as exc:
        raise WindowError(exc.reason, field=f"requests.{i}.{exc.field or 'window'}") from None
    except NamespaceNotFound as exc:
        raise NamespaceNotFound(f"requests.{i}.namespace: {exc}") from None
