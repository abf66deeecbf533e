"""Ready-made entity types. ``entities.registry`` holds all of them."""

from runtime import Registry

from . import notes

registry = Registry()
notes.register(registry)

__all__ = ["registry"]
