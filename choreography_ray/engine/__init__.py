"""Job and step lifecycles as async state machines over ports (storage, dispatch, clock).

No Ray import here: the same engine runs in-process in tests and inside Ray host actors.
"""
