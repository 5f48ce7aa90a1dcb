"""librdkafka's mock cluster with several brokers, through its C API (ctypes on the library confluent-kafka
ships): topics with partition leaders spread over the brokers, and a leader moved on command. The cluster
lives in this process, inside a librdkafka handle, for as long as the object does."""

from __future__ import annotations

import ctypes
import glob
import os

import confluent_kafka


def _library() -> ctypes.CDLL:
    here = os.path.dirname(confluent_kafka.__file__)
    found = glob.glob(os.path.join(here, "..", "confluent_kafka.libs", "librdkafka*.so*"))
    return ctypes.CDLL(found[0] if found else "librdkafka.so.1")


class MockCluster:
    def __init__(self, brokers: int):
        lib = self._lib = _library()
        lib.rd_kafka_conf_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.restype = ctypes.c_void_p
        lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
        lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
        lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
        lib.rd_kafka_mock_partition_set_leader.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int32,
                                                           ctypes.c_int32]
        error = ctypes.create_string_buffer(512)
        # A producer handle (type 0) hosts the mock cluster's threads.
        self._handle = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), error, len(error))
        if not self._handle:
            raise RuntimeError(error.value.decode())
        self._cluster = lib.rd_kafka_mock_cluster_new(self._handle, brokers)
        self.bootstrap: str = lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def create_topic(self, topic: str, partitions: int) -> None:
        code = self._lib.rd_kafka_mock_topic_create(self._cluster, topic.encode(), partitions, 1)
        assert code == 0, code

    def set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        code = self._lib.rd_kafka_mock_partition_set_leader(self._cluster, topic.encode(), partition, broker_id)
        assert code == 0, code

    def close(self) -> None:
        self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
        self._lib.rd_kafka_destroy(self._handle)
