"""Request handlers, grouped by API family; each is given its services (`services.py`), wired by the server."""
