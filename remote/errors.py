"""A box's own failure: one of its tools failed, or answered with something that is not its reply.

Apart from remote/model.py and remote/boxapi.py (re-exported by both), so that the screens can
catch it without loading either before their first paint."""


class BoxError(Exception):
    """A box tool failed or answered with something that is not its reply."""
