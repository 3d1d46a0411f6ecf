"""Exceptions raised by corefarm. Everything derives from `corefarm.Error`;
the connection and timeout errors also derive from the built-in
ConnectionError / TimeoutError, so generic handlers catch them too."""

import builtins as _builtins


class Error(Exception):
    """Base class of every corefarm error."""


class ConnectionError(Error, _builtins.ConnectionError):
    """Could not connect, the hello exchange failed, or the connection was lost."""


class ServerLostError(ConnectionError):
    """The server connection broke and no server (of the address list) took
    the session back within `reconnect_timeout`. `unanswered` is the number
    of data messages (one per `map` input) that never got their result."""

    def __init__(self, message, unanswered=0):
        super().__init__(message)
        self.unanswered = unanswered
        """Data messages sent and never answered."""


class TimeoutError(Error, _builtins.TimeoutError):
    """A blocking call did not complete in time."""


class ConfigurationError(Error):
    """The configuration was refused (or data was sent before configuring).

    `status` is the configuration response's status byte (None if none
    arrived), `reason` the server's explanation when it sent one."""

    def __init__(self, message, status=None, reason=None):
        super().__init__(message)
        self.status = status
        """The configuration response's status byte, or None if none arrived."""
        self.reason = reason
        """The server's explanation (its error messages), or None."""


class ServerError(Error):
    """The server reported an error: `code` (see ERROR_CODES), `reason`, and
    `id`, the data message concerned (None if it concerns the whole session)."""

    def __init__(self, message, code=0, reason="", id=None):
        super().__init__(message)
        self.code = code
        """The error code (a key of ERROR_CODES)."""
        self.reason = reason
        """The server's explanation."""
        self.id = id
        """The data message concerned, or None if the error concerns the whole session."""

    @property
    def code_name(self):
        """The code's name, e.g. "no-nodes" ("unknown" for a code this version does not know)."""
        return ERROR_CODES.get(self.code, "unknown")


class ProtocolError(Error):
    """A message broke the SMP format; `kind` names the rule (see tests/vectors)."""

    def __init__(self, message, kind=None):
        super().__init__(message)
        self.kind = kind
        """The rule broken, as named in tests/vectors/smp.json."""


class InputError(Error, ValueError):
    """Data that cannot be sent as given (size not a whole number of inputs...)."""


class UsageError(Error, RuntimeError):
    """The client was used in a way that cannot work, e.g. `recv()` while
    every result in flight belongs to a `map()` or a `Pending`; the message
    says what to do instead (rather than waiting forever)."""


class UnsupportedError(Error):
    """The server does not offer what was asked (e.g. `status()` from a
    server without the status extension, or in legacy mode), or the link
    asked for does not exist: `Group.direct_map` on a group opened over TLS
    (the members' peer ports speak plain TCP only)."""


ERROR_CODES = {
    1: "malformed",
    2: "too-large",
    3: "unexpected-message",
    4: "not-configured",
    5: "bad-data-size",
    6: "no-nodes",
    7: "configuration-failed",
    8: "timeout",
    9: "core-failure",
    10: "internal",
    11: "unauthorized",
    12: "queue-full",
}
"""Names of the codes of the server's Error message, by number (docs/protocol.md, type 0x11)."""


class ImageError(Error, ValueError):
    """A configuration image could not be built or is not valid."""


class GroupError(Error):
    """A group command failed (docs/collectives.md). `rank` and `node` name
    the member held responsible (None if none is), `op` the operation, e.g.
    "allreduce #7". A failure that blames a member ends the group: later
    calls raise GroupError too."""

    def __init__(self, message, rank=None, node=None, op=None):
        super().__init__(message)
        self.rank = rank
        """The rank held responsible, or None."""
        self.node = node
        """That member as `name@peer-address`, or None."""
        self.op = op
        """The operation that failed, e.g. "allreduce #7", or None."""


class GroupTimeoutError(GroupError, TimeoutError):
    """Members did not answer a group command within its timeout; `rank` is
    the first of them."""
