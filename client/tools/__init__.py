"""Command-line tools mirroring Kafka's: kafka-share-groups, kafka-console-share-consumer and
kafka-share-consumer-perf-test (entry points in pyproject.toml)."""
