"""The exception cluster code raises when a cluster cannot be formed or kept: one line, no traceback."""


class ClusterError(RuntimeError):
    """A node that did not join, a head out of reach, mismatched versions: said in one line that
    names the node, the setting involved and what to do."""
