"""Errors the training package raises for problems a user can fix."""


class ConfigError(ValueError):
    """An invalid configuration value. The message names the field (dotted path), the value and what is
    allowed, e.g. ``fp8.backend='fp4': allowed: none, torchao, te``."""
