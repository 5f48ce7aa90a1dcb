"""Request handlers, grouped by API family; `handlers.register_all` puts them in the dispatch table."""
