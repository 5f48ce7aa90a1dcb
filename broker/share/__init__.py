"""Share groups on the partition leader (KIP-932): share partitions, their leader, share sessions and
the dynamic group configs they read."""
