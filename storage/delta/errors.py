"""Why a delta payload was refused. Either way the receiver asks for a full snapshot."""


class DeltaError(Exception):
    """A payload that cannot be applied; nothing was changed on the receiver."""


class DeltaBaseMismatch(DeltaError):
    """The receiver does not hold the base the payload was encoded against."""


class CorruptPayload(DeltaError):
    """The payload bytes are truncated, malformed, or fail their checksum."""
