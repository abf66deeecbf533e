"""Ready-made tools for agents (memory, dispatch, calculator, schedules) arrive with the agent loop."""
