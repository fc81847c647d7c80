"""Moved: validation is part of the one check path in ``tools/`` (``tools.validation``)."""

from tools.validation import MAX_ERRORS, validate, validator_for

__all__ = ["MAX_ERRORS", "validate", "validator_for"]
