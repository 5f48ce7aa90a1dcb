"""What every layer of the broker reads: its settings, the metrics it counts into, and the purgatory where
long polls and other delayed operations wait. Nothing here imports above `protocol/` and `shoal`."""
