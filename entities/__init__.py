"""Ready-made entity types. ``wakeful.entities.registry`` holds all of them:

* ``notes``: a to-do list driven by short commands (no model).
* ``assistant``: an agent with memory, a calculator and delegation to
* ``researcher`` children (Claude with ``ANTHROPIC_API_KEY``, scripted without).
"""

from wakeful import Registry

from . import assistant, notes

registry = Registry()
notes.register(registry)
assistant.register(registry)

__all__ = ["registry"]
