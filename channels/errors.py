"""The root of absflow's errors, shared by every package.

It lives in the lowest layer (``channels`` imports nothing of ours) so that
``statebackend``, ``runtime`` and ``jobmanager`` can all derive from it without
import cycles. Users import it as ``runtime.AbsflowError``.
"""


class AbsflowError(Exception):
    """Root of every error absflow raises on purpose.

    Messages say what is wrong, the value involved, and how to fix it.
    """
