"""The error a bootstrap step raises when it cannot bring the node to the wanted state.

Its own module, importing nothing of the package, so that every module can raise it (deadline.py derives
DeadlineExceeded from it) without importing plan.py, which itself depends on runner.py and deadline.py.
"""


class StepError(RuntimeError):
    """A step cannot bring the node to the wanted state; the message says why and what to do."""
