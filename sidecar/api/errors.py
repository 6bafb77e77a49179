"""The servers' own error: `ListenError`, one cannot listen. Errors of requests and of the
backend are the runtime's (`sidecar.runtime.errors`).
"""

from __future__ import annotations


class ListenError(OSError):
    """The gRPC or HTTP server cannot listen on its configured address (in use, not an
    address of this host, a privileged port): the message names the address and setting."""
