"""Ready-made tools for agents (``ctx.use_agent(tools=[...])``).

* :data:`calculator`: safe arithmetic (parsed with ``ast``, never ``eval``).
* :func:`memory_store`: a durable key/value memory kept in a collection of the
  entity (declare ``MEMORY_COLLECTION`` in the type's ``state``).

The runtime's own tools (send a message, dispatch a child agent, schedule a
message) are ``ctx.runtime_tools``.
"""

from .calculator import calculator
from .memory import MEMORY_COLLECTION, MemoryRequest, Note, memory_store

__all__ = ["MEMORY_COLLECTION", "MemoryRequest", "Note", "calculator", "memory_store"]
