"""The one exception type the launcher raises for bad input: it names the key and the fix."""


class LaunchError(ValueError):
    """A configuration or environment problem found before any Ray or GPU work."""
