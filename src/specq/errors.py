"""The one exception type users see: its message is printed as a single line by the CLI."""


class SpecqError(Exception):
    """A problem with the user's input or environment (bad model ref, bad option, ...)."""
