"""What the coordinator and the sites share about a federation: the plan, the wire envelopes, the PKI and
the released model (transport-free; ``server/`` and ``client/`` build on it)."""
