"""Sidecar mode: Shoal's client side towards an upstream Kafka-protocol cluster (connections, metadata,
per-partition routing, coordinator lookup) and the forwarding the handlers call."""
