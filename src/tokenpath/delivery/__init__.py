"""The last mile: token ids to visible text (detokenize, stop strings, SSE) and its delivery-time model."""

from tokenpath.delivery.detokenizer import Detokenizer
from tokenpath.delivery.stream import BatchStream, TokenIdError

__all__ = ["BatchStream", "Detokenizer", "TokenIdError"]
