"""Streaming edges: per-request consumer buffers cut into chunks by a chunk policy."""
from runtime.streams.chunk_policy import Chunk, ChunkPolicy, Fixed, LeftContext, Sliding, StreamBuffer

__all__ = ["Chunk", "ChunkPolicy", "Fixed", "LeftContext", "Sliding", "StreamBuffer"]
