"""What the batch routes share: a refusal of one of a batch's entries names it (`requests.N.<field>`), and each
namespace's access rules are checked at the first entry that names it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from control_plane import Namespace
from query_api.dependencies import Forbidden, authorize
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
    except Forbidden as exc:
        raise Forbidden(exc.status, f"requests.{i}.namespace: {exc.detail}") from None


def authorize_entries(namespaces: Sequence[Namespace], key: str | None, *scopes: str) -> None:
    """`authorize` every namespace of a batch, a refusal naming the first entry that named the namespace (a client
    with many entries learns which one its key may not use)."""
    seen: set[str] = set()
    for i, ns in enumerate(namespaces):
        if ns.name not in seen:
            seen.add(ns.name)
            with entry(i):
                authorize(ns, key, *scopes)
