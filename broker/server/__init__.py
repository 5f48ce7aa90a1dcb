"""The server: wiring of the broker's services, its configuration, metrics and the main entry point."""
