"""The error every check of a run raises; tools print it as one ``aa_det: ...`` line."""


class ConfigError(ValueError):
    """A config or a file it points at is unusable; the message names it."""
