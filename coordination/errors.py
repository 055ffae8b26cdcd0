"""The one error type the stack raises: its message is the single line the CLI prints."""


class StackError(RuntimeError):
    """Something in the local stack could not start, answer or stop."""


class PortBusyError(StackError):
    """A port the user asked for is already taken."""
