"""Kafka wire protocol: JSON message specs, the codec built from them, record batches. No I/O."""
