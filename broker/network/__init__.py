"""The network layer: Kafka's request framing and the asyncio connection that serves one client."""
