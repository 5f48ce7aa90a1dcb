"""Shoal: a Kafka-protocol broker with share groups."""
