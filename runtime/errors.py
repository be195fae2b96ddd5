"""Every exception type the runtime raises, in one place.

User-fixable problems carry the fix in their message (usually the config setting to change).
"""


class RuntimeErrorBase(Exception):
    """Base of all runtime errors, so callers can catch the family at once."""


class ProtocolError(RuntimeErrorBase):
    """A frame or message that does not follow the wire protocol.

    Raised by the decoder for every kind of malformed input (random bytes, truncation, unknown
    kind, wrong field types, size over the limit). Receivers count and drop it and go on serving.
    """


class RequestTimeout(RuntimeErrorBase, TimeoutError):
    """No reply arrived within the deadline; the message names the setting to raise."""


class RemoteError(RuntimeErrorBase):
    """The peer handled the request and answered with an error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class TransportClosed(RuntimeErrorBase):
    """The connection or listener was closed while a call was using it."""


class WorkerStartError(RuntimeErrorBase):
    """A worker process exited, or stayed silent past its deadline, before announcing Ready."""


class PeerDied(RuntimeErrorBase):
    """The process serving a request died (or went silent and was killed) before replying."""
