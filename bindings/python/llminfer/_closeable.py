"""The lifetime protocol every handle-owning class shares."""

from __future__ import annotations

from typing import TypeVar

_Self = TypeVar("_Self", bound="Closeable")


class Closeable:
    """A `with` block and the garbage collector both end in close(), which
    subclasses make idempotent; explicit close() stays the reliable way."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may be gone
            pass
