"""The interface every chunk source implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence


class ChunkStore(ABC):
    """Reads the stored bytes of many chunks of one array at once.

    Implementations must be picklable and hold no open handles or GPU state,
    since dask ships them to workers inside task arguments.
    """

    #: what to call the array in messages
    array: str

    @abstractmethod
    def read_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The bytes of each chunk key (relative to the array), ``None`` where absent."""

    @abstractmethod
    def token(self) -> str:
        """A string that identifies the location, for dask task names (no credentials)."""
