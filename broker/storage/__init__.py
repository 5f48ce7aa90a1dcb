"""Storage: partition logs and their segments, producer state, the topic registry, internal topics and
the purgatory where long polls wait for a log or share partition to change."""
