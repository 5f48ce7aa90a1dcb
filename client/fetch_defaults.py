"""Kafka's consumer default for how much one Fetch asks of a partition (max.partition.fetch.bytes).

Its own module so the Spark source can name it without importing a client and the protocol classes.
"""

# A range of several megabytes is then read in several fetches, each decoded while the next is under way
# (a Spark task read in one 8 MiB fetch had the broker, the decoding and Spark take turns), in buffers
# that stay in the CPU's caches.
MAX_PARTITION_FETCH_BYTES = 1024 * 1024
