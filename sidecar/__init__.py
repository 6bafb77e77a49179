"""rsub: replicated subscriptions for NATS JetStream virtual streams."""

__version__ = "0.1.0"
