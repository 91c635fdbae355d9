"""The composition roots above ``sync`` and ``webhooks``: the operator's command and the demo."""
