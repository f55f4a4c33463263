"""The one error type the local cluster raises: its message is a sentence a user can act on."""


class ClusterError(RuntimeError):
    """Something about the local control plane went wrong; str() says what and what to do."""
